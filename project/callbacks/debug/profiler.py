"""`ScheduledProfiler`: Lightning's PyTorchProfiler with a typed wait/warmup/active schedule and a trace folder."""

import os
from pathlib import Path

import torch
from lightning.pytorch.profilers import PyTorchProfiler

from project.errors import UserError


class ScheduledProfiler(PyTorchProfiler):
    """Profiles a few training steps with `torch.profiler` and writes traces to a folder.

    Each loop's steps follow one schedule: `wait` steps untouched (start-up, cuDNN autotuning,
    compilation), `warmup` steps profiled and thrown away (the profiler's own start-up), then `active`
    steps recorded, `repeat` times. Per recorded cycle, a trace `*.pt.trace.json` goes to `dirpath`:
    open it at https://ui.perfetto.dev (or chrome://tracing), or in TensorBoard with the
    torch-tb-profiler plugin (`tensorboard --logdir <dirpath>`). A table of the most expensive
    operators is written to `<stage>-profile.txt` there. Gaps between the GPU's kernels in a trace are
    the GPU waiting: for data (look for `train_dataloader_next`), for the CPU launching small kernels,
    or for host-device copies and synchronisations (`.item()`, `.cpu()`).

    Args:
        wait: Steps skipped before profiling starts.
        warmup: Steps profiled but discarded.
        active: Steps recorded per cycle.
        repeat: Cycles recorded (0: keep cycling until the run ends).
        dirpath: Folder for traces and tables. Default: `profiler/` in the run's log directory.
        record_shapes: Record operator input shapes (group the table by shape to find slow sizes).
        profile_memory: Record tensor allocations (memory columns in the table and trace).
        with_stack: Record Python stacks for each operator (larger traces; enables flame graphs).
        row_limit: Rows in the operator table.
        sort_by_key: Table column to sort by, e.g. `cpu_time_total`, `cuda_time_total`,
            `self_cuda_memory_usage`. Default: CUDA time when on a GPU, else CPU time.
    """

    # Only training steps advance the schedule: validation steps do not eat into it, and the table describes
    # the training steps recorded (Lightning's default also steps on validation, so that a short validation
    # could end the recording on a cycle holding little but a checkpoint save).
    STEP_FUNCTIONS = {"training_step"}

    def __init__(
        self,
        wait: int = 2,
        warmup: int = 2,
        active: int = 5,
        repeat: int = 1,
        dirpath: str | None = None,
        record_shapes: bool = False,
        profile_memory: bool = False,
        with_stack: bool = False,
        row_limit: int = 30,
        sort_by_key: str | None = None,
    ) -> None:
        if wait < 0 or warmup < 0 or active < 1 or repeat < 0:
            raise UserError(
                f"ScheduledProfiler: need wait >= 0, warmup >= 0, active >= 1 and repeat >= 0, got wait={wait}, "
                f"warmup={warmup}, active={active}, repeat={repeat}"
            )
        super().__init__(
            dirpath=dirpath,
            filename="profile",
            export_to_chrome=True,
            row_limit=row_limit,
            sort_by_key=sort_by_key,
            schedule=torch.profiler.schedule(wait=wait, warmup=warmup, active=active, repeat=repeat),
            record_shapes=record_shapes,
            profile_memory=profile_memory,
            with_stack=with_stack,
        )
        self._default_dirpath = dirpath is None
        self._table_name = "profile.txt"
        self._rank: int | None = None

    def setup(self, stage: str, local_rank: int | None = None, log_dir: str | None = None) -> None:
        super().setup(stage, local_rank, log_dir)
        if self._default_dirpath:
            self.dirpath = os.path.join(log_dir or ".", "profiler")
        # The name Lightning's describe() writes the table under: <stage>-profile[-<rank>].txt
        self._table_name = (
            "-".join([stage, "profile", *([str(local_rank)] if local_rank is not None else [])]) + ".txt"
        )
        self._rank = local_rank

    def describe(self) -> None:
        table = Path(self.dirpath or ".") / self._table_name
        super().describe()
        if self._rank not in (None, 0):
            return
        traces = sorted(Path(self.dirpath).glob("*.pt.trace.json")) if self.dirpath else []
        where = f"{len(traces)} trace(s) in {self.dirpath} (open one at https://ui.perfetto.dev)"
        print(f"Profiler: {where}; operator table: {table}", flush=True)
