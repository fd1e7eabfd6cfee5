"""A command's start-up without the cyclic garbage collector.

Importing torch, torchvision and Lightning and parsing a config create a few million long-lived objects and
almost no garbage; every full collection on the way walks all of them again, several times over before the
first training step. `python -m project fit|validate|test|predict` therefore pauses the collector before its
imports and resumes it when the Trainer is about to run, after freezing what start-up built (`gc.freeze`): the
objects every later collection would only walk again, and the pages of memory the DataLoader's forked workers
then share instead of copying. Reference counting frees memory as always throughout; the few cycles start-up
leaves behind stay in memory.

Nothing here imports more than `gc`: the entry point calls it before anything heavy is imported.
"""

import gc

_paused = False


def pause_garbage_collection() -> None:
    """Turn the cyclic collector off for the start-up (a no-op when something else already turned it off)."""
    global _paused
    if gc.isenabled():
        gc.disable()
        _paused = True


def resume_garbage_collection() -> None:
    """Freeze what start-up built and turn the collector back on, if `pause_garbage_collection` turned it off."""
    global _paused
    if _paused:
        gc.freeze()
        gc.enable()
        _paused = False
