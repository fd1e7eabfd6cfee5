"""Lightning's notices that say nothing a template user can act on, left out of every command."""

import logging
import os
import re
import warnings

SRUN_HINT = r"The `srun` command is available on your system but is not used"
CKPT_CALLBACKS_NOTICE = r"Be aware that when using `ckpt_path`, callbacks used to create the checkpoint"
SHORT_EPOCH_NOTICE = r"The number of training batches \(\d+\) is smaller than the logging interval"


def quiet_lightning_notices() -> None:
    """Leave out Lightning's notices that say nothing to act on in a template run. Safe to call again: `main`
    calls it for the tools, and every command (project.cli.config.parse) for notebooks and scripts that run one
    without `main`."""
    if not os.environ.get("SLURM_JOB_ID"):
        # Outside a SLURM job (a cluster's login node, a laptop with SLURM installed) the run is not meant for
        # SLURM; inside one, a command without srun would hang its other processes: the hint stays.
        warnings.filterwarnings("ignore", message=SRUN_HINT)
    # The template gives every run the callbacks its checkpoints need (fit) or none that keep state (validate,
    # test, predict), so Lightning's reminder to provide them is noise on every --ckpt_path.
    warnings.filterwarnings("ignore", message=CKPT_CALLBACKS_NOTICE)
    # A task logs its training metrics once per epoch (the epoch's means), whatever log_every_n_steps says: an
    # epoch shorter than that interval loses none of them.
    warnings.filterwarnings("ignore", message=SHORT_EPOCH_NOTICE)
    # Deprecations inside Lightning itself and jsonargparse as Lightning calls it.
    warnings.filterwarnings("ignore", message=r".*isinstance\(treespec, LeafSpec\)")
    warnings.filterwarnings("ignore", message=r"(?s).*was deprecated in v4\.49\.0")
    notices = logging.getLogger("lightning.pytorch.utilities.rank_zero")
    if not any(isinstance(f, _NoAbsentDevices) for f in notices.filters):
        notices.addFilter(_NoAbsentDevices())
    # An advert printed on every run, and a notice about Lightning's own loader estimate.
    for handler in logging.getLogger("lightning.pytorch").handlers:
        if not any(isinstance(f, _NoAdverts) for f in handler.filters):
            handler.addFilter(_NoAdverts())


class _NoAbsentDevices(logging.Filter):
    """Drops "TPU available: False, using: 0 TPU cores" and the like: a device the machine does not have."""

    def filter(self, record: logging.LogRecord) -> bool:
        return not re.match(r"\w+ available: False", record.getMessage())


class _NoAdverts(logging.Filter):
    """Drops Lightning's tips (an advert on every run) and its notice that it loads the training loader to
    estimate the number of steps (the schedule asks for it; nothing to act on)."""

    NOISE = ("💡 Tip", "Loading `train_dataloader` to estimate number of stepping batches")

    def filter(self, record: logging.LogRecord) -> bool:
        return not record.getMessage().startswith(self.NOISE)
