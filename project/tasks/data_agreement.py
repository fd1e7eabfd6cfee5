"""What a task and its data must agree on, checked before anything trains: the kind of target, and the number of
outputs the network gives."""

from typing import Any, ClassVar, Protocol

from torch import Tensor, nn

from project.data.targets import TargetKind
from project.errors import UserError


class Task(Protocol):
    """What the checks read of a task (an `ImageTask`)."""

    accepts: ClassVar[tuple[type[TargetKind], ...]]
    example_config: ClassVar[str]
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
    shipped = [t for t in shipped_tasks(type(task)) if isinstance(kind, t.accepts)]
    package = __name__.rpartition(".")[0]
    todo = (
        f"train it with --model {package}.{shipped[0].__name__} (as {shipped[0].example_config} does)"
        if shipped
        else "no task here takes them: write one (README, Add a task)"
    )
    raise UserError(
        f"the data ({type(datamodule).__name__}) gives {kind.described} but model {type(task).__name__} takes "
        f"{takes}: {todo}"
    )


def shipped_tasks(task: type[Task]) -> list[type[Task]]:
    """The tasks of this package (those its `tasks` package imports), in the order they were defined: the
    subclasses of the base every task shares, the first of `task`'s classes to say what it `accepts`."""
    base = [cls for cls in task.__mro__ if "accepts" in vars(cls)][-1]
    package = __name__.rpartition(".")[0]
    found, todo = [], list(base.__subclasses__())
    while todo:
        task = todo.pop(0)
        todo += task.__subclasses__()
        if task.__module__.startswith(f"{package}.") and task not in found:
            found.append(task)
    return found


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
