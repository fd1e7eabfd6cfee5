"""What a task and its data must agree on, checked before anything trains: the kind of target, and the number of
outputs the network gives."""

from typing import Any, ClassVar, Protocol

from torch import Tensor, nn

from project.data.targets import TargetKind
from project.errors import UserError
from project.registry import load_all


class Task(Protocol):
    """What the checks read of a task (an `ImageTask`)."""

    accepts: ClassVar[tuple[type[TargetKind], ...]]
    example_config: ClassVar[str | None]
    net: nn.Module

    @property
    def targets(self) -> TargetKind: ...

    @property
    def network_outputs(self) -> int: ...


def check_task_fits_data(task: Task, datamodule: Any) -> None:
    """A UserError naming both when the data's kind of target is not one the task accepts (a task that reads
    the targets another way than the data gives them, cross-entropy on multi-hot rows, would train on them
    without an error)."""
    kind = getattr(datamodule, "targets", None)
    if not isinstance(kind, TargetKind) or isinstance(kind, task.accepts):
        return
    takes = " or ".join(accepted.described for accepted in task.accepts)
    # The tasks the packages present register (project.registry), a config names them by their class name.
    shipped = [t for t in load_all("tasks").values() if isinstance(kind, t.accepts)]
    example = f" (as {shipped[0].example_config} does)" if shipped and shipped[0].example_config else ""
    todo = (
        f"train it with --model {shipped[0].__name__}{example}"
        if shipped
        else "no task here takes them: write one (README, Add a task)"
    )
    raise UserError(
        f"the data ({type(datamodule).__name__}) gives {kind.described} but model {type(task).__name__} takes "
        f"{takes}: {todo}"
    )


def check_network_outputs(task: Task, outputs: Tensor) -> None:
    """A UserError when the network gives another number of outputs per image than the task needs (a network
    that ignores the `num_classes` linked from the data, or a head set by hand)."""
    needed = task.network_outputs
    given = outputs.shape[-1] if outputs.ndim >= 2 else 1
    if given == needed:
        return
    kind = task.targets
    names = ", ".join(kind.names[:5]) + (" ..." if len(kind.names) > 5 else "")
    raise UserError(
        f"the network ({type(task.net).__name__}) gives {given} output(s) per image and {type(task).__name__} needs "
        f"{needed}, one per {kind.noun} ({names}): give the network that many outputs (its num_classes is "
        "linked from the data; a network without that argument needs its head made that wide)"
    )
