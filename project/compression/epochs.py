"""Epoch arguments of scheduled callbacks: negative values count from the end of training, like list indices."""

from lightning.pytorch.utilities import rank_zero_info

from project.errors import UserError


def resolve_epoch(value: int, max_epochs: int | None, name: str, notify: bool = True) -> int:
    """The epoch index `value` stands for: `-1` is the last epoch of `max_epochs`, `-5` the fifth from the end.

    Values beyond the run are clamped into it (a short debug run still exercises the schedule), with a notice.
    """
    if value >= 0 and (max_epochs is None or max_epochs < 0):
        return value
    if max_epochs is None or max_epochs < 0:
        raise UserError(
            f"{name}={value} counts from the end of training, which needs trainer.max_epochs "
            "(unlimited here): set trainer.max_epochs, or give the epoch as a non-negative number"
        )
    resolved = max_epochs + value if value < 0 else value
    clamped = min(max(resolved, 0), max_epochs - 1)
    if clamped != resolved and notify:
        rank_zero_info(f"{name}={value} is outside trainer.max_epochs={max_epochs}: using epoch {clamped}")
    return clamped
