"""A finished fit run's best model, evaluated in this process on its own validation split or on the test split.

The model and DataModule are rebuilt from the run's saved `config.yaml` by `fit`'s own parser (so the links,
the fold and every setting are as in training) and the weights come from the checkpoint (`weights_only`); the
images are normalised with the mean and std the checkpoint recorded. The model's own `forward` is used, so
test-time flips and the task's own loss and metrics count exactly as in `fit`'s `val/loss` and `val/acc` (or
`val/map`, `val/mae`: the metric of the data's kind of target).
"""

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from project.data.targets import TargetKind
from project.errors import UserError
from project.run.checkpoints import load_checkpoint, load_weights
from project.run.resume import best_checkpoint, find_last_checkpoint


@dataclass
class Evaluation:
    """A split's targets, of the data's kind, and what the task makes of its outputs there (`probabilities`:
    class or tag probabilities, or values), the mean loss over it, and the task's own metrics (`<split>/<name>`,
    as `fit` logs them: `val/acc`, `val/map`, `val/mae` ...)."""

    kind: TargetKind
    probs: torch.Tensor
    targets: torch.Tensor
    loss: float
    metrics: dict[str, float] = field(default_factory=dict)

    @property
    def score_name(self) -> str:
        """What `score` is, as `fit` names it: the kind's headline metric (`acc`, `map`, `mae`)."""
        return self.kind.metric

    @property
    def score(self) -> float:
        """The kind's headline figure (top-1 accuracy, exact macro mAP, mean absolute error) of any outputs,
        such as the mean of several models' (cv's ensemble)."""
        return self.kind.score(self.probs, self.targets)

    def per_class(self, class_names: list[str]) -> dict[str, float | None]:
        """Each name's figure (a class's accuracy, a tag's average precision, a value's mean absolute error);
        None for a class or tag the split has no positive image of."""
        return type(self.kind)(tuple(class_names)).per_name(self.probs, self.targets)


@dataclass
class BestModel:
    """A run's best checkpoint: the model in eval mode, its DataModule (set up for fit), and the epoch."""

    model: Any
    datamodule: Any
    ckpt_path: Path
    epoch: int
    recorded_score: float | None
    datamodule_state: dict[str, Any] | None


def best_of_run(root_dir: Path) -> tuple[Path, dict[str, Any]]:
    """(the best checkpoint, the state of `last.ckpt`) of the run under `root_dir`."""
    last = find_last_checkpoint(root_dir)
    if last is None:
        raise UserError(
            f"the run in {root_dir} wrote no last.ckpt: the study needs checkpoints "
            "(trainer.enable_checkpointing and checkpoint.save_last)"
        )
    state = load_checkpoint(last)
    return best_checkpoint(last, state), state


def load_best(root_dir: Path) -> BestModel:
    """The best checkpoint (by the run's `checkpoint.monitor`) of the fit run under `root_dir`, rebuilt."""
    from project.cli.config import fit_parser

    ckpt_path, last = best_of_run(root_dir)
    config_file = ckpt_path.parent.parent / "config.yaml"
    if not config_file.is_file():
        raise UserError(f"no config.yaml beside {ckpt_path.parent} (it is written by `fit` at the start)")
    parser = fit_parser()
    try:
        config = parser.parse_args(["--config", str(config_file), "--trainer.logger", "false"])
    except Exception as e:  # jsonargparse's ArgumentError: its first line names the key and value
        raise UserError(f"{config_file}: {str(e).strip().splitlines()[0]}") from None
    init = parser.instantiate(config)
    checkpoint = load_checkpoint(ckpt_path)
    load_weights(init.model, checkpoint["state_dict"], source=f"checkpoint {ckpt_path}")
    score = next(
        (s.get("best_model_score") for k, s in last.get("callbacks", {}).items() if "Checkpoint" in k),
        None,
    )
    return BestModel(
        model=init.model.eval(),
        datamodule=init.data,
        ckpt_path=ckpt_path,
        epoch=int(checkpoint["epoch"]),
        recorded_score=None if score is None else float(score),
        datamodule_state=checkpoint.get(type(init.data).__qualname__),
    )


@torch.no_grad()
def evaluate(best: BestModel, split: str) -> Evaluation:
    """The model on the `val` or `test` split of its own DataModule, normalised as in its checkpoint."""
    dm, model = best.datamodule, best.model
    dm.setup("fit" if split == "val" else "test")
    if best.datamodule_state:
        dm.load_state_dict(best.datamodule_state)  # the mean and std the model was trained with
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    model.to(device)
    loader = dm.val_dataloader() if split == "val" else dm.test_dataloader()
    metrics = model.make_metrics().clone(prefix=f"{split}/").to(device)
    probs, targets, loss = [], [], 0.0
    for x, y in loader:
        x, y = dm.transform_batch((x.to(device), y.to(device)), train=False)
        logits = model(x).float()
        loss += float(model.loss(logits, y)) * len(y)  # the task's own loss, as `fit` logs val/loss
        model.update_metrics(metrics, logits, y)  # and its own metrics
        probs.append(model.probabilities(logits).cpu())
        targets.append(y.cpu())
    if not targets:
        raise UserError(f"the {split} split of {best.ckpt_path} has no images")
    targets_all = torch.cat(targets)
    values = {name: float(value) for name, value in metrics.compute().items()}
    return Evaluation(dm.targets, torch.cat(probs), targets_all, loss / len(targets_all), values)
