"""What data a checkpoint was trained on, and the one-line refusal when a command would use it on other data.

A checkpoint's outputs mean its classes in its order: output 3 is `cat` only as long as the data's class 3 is
`cat`. After a class folder is renamed, added or removed (or `prepare --overwrite` made other classes), the same
indices mean other classes: a resumed fit would go on training the old head on re-indexed labels, an evaluation
would score it against them. So every checkpoint records the data's identity (`data_identity`, written by
`ImageTask.on_save_checkpoint`): the kind of names (classes or tags), the names in order and the DataModule that
gave them. Every command that starts from a checkpoint compares them with the data's (`check_same_names`), before
anything is built from it (`check_checkpoint_file`) and again as Lightning loads it (scripts that drive the
Trainer themselves). Fine-tuning onto other classes is a separate, explicit setting (`model.init_from`).

Checkpoints written before the record existed fall back to the names their task recorded (`task.names`); one
that holds neither is used without a check.
"""

from pathlib import Path
from typing import Any

import torch

from project.errors import UserError
from project.registry import load, registered

KEY = "data_identity"
SHOWN = 12  # names listed in a message before "..."


def recorded_names(checkpoint: dict[str, Any]) -> tuple[str, list[str]] | None:
    """(kind, names) a checkpoint was trained on; None for one that records neither."""
    record = checkpoint.get(KEY)
    if isinstance(record, dict) and isinstance(record.get("names"), list):
        return str(record.get("kind") or "classes"), [str(n) for n in record["names"]]
    task = checkpoint.get("task")
    if isinstance(task, dict) and isinstance(task.get("names"), list) and task["names"]:
        # Recorded before the data recorded its kind: the task's record says it, or the task (the first it accepts).
        name = task.get("task")
        accepted = load("tasks", name).accepts[0].kind if name in registered("tasks") else "classes"
        return str(task.get("kind") or accepted), [str(n) for n in task["names"]]
    return None


def check_checkpoint_file(task: Any, ckpt_path: str | Path, fitting: bool) -> None:
    """`check_same_names` of the checkpoint file `ckpt_path` against `task`'s class names, before a command
    builds anything from it."""
    check_same_names(read_recorded_names(ckpt_path), getattr(task, "class_names", []), ckpt_path, fitting)


def read_recorded_names(path: str | Path) -> tuple[str, list[str]] | None:
    """`recorded_names` of the checkpoint file `path` (already checked by `load_checkpoint`); the tensors are
    memory-mapped, not read."""
    try:
        checkpoint = torch.load(path, map_location="cpu", weights_only=True, mmap=True)
    except RuntimeError:  # the legacy (non-zip) format cannot be memory-mapped
        checkpoint = torch.load(path, map_location="cpu", weights_only=True)
    return recorded_names(checkpoint)


def difference(before: list[str], now: list[str]) -> str:
    """How the names `now` differ from `before`: renamed, added, removed or re-ordered."""
    removed = [n for n in before if n not in now]
    added = [n for n in now if n not in before]
    if removed and len(removed) == len(added):
        return "renamed " + ", ".join(f"{a} -> {b}" for a, b in zip(removed, added, strict=True))
    parts = [f"added {', '.join(added)}"] if added else []
    parts += [f"removed {', '.join(removed)}"] if removed else []
    if parts:
        return "; ".join(parts)
    moved = [n for i, n in enumerate(now) if before[i] != n]
    return f"re-ordered ({', '.join(moved[:SHOWN])} at other positions)"


def listed(names: list[str]) -> str:
    """`[a, b, c]`, cut after SHOWN names."""
    shown = ", ".join(names[:SHOWN])
    return f"[{shown}, ... ({len(names)} in all)]" if len(names) > SHOWN else f"[{shown}]"


def check_same_names(
    recorded: tuple[str, list[str]] | None, names: list[str], ckpt_path: Any, fitting: bool
) -> None:
    """A UserError naming the difference when the data's `names` are not the checkpoint's, in its order."""
    if recorded is None or not names:
        return
    kind, before = recorded
    if before == list(names):
        return
    if fitting:
        todo = (
            f"resume only onto the same {kind}, or start a new fit from its weights with "
            f"--model.init_from {ckpt_path} (all but the output layer)"
        )
    else:
        todo = f"evaluate it on data with the same {kind}, in the same order"
    raise UserError(
        f"the checkpoint {ckpt_path} was trained on {kind} {listed(before)}; the data now has "
        f"{listed(list(names))}: {difference(before, list(names))}. {todo[0].upper()}{todo[1:]}"
    )
