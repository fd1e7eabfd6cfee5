"""`RNGState`: every process's global random generators in every checkpoint, restored on resume.

Lightning restores the model, optimizer, schedulers, loops and callbacks on resume, but not the generators: a
resumed run would restart them from `seed_everything` and shuffle and augment the next epochs differently from
the run it continues.
"""

import random
from typing import Any

import lightning as L
import numpy as np
import torch
from lightning.pytorch.callbacks import Callback


def collect_rng_states() -> dict[str, Any]:
    """torch (CPU and CUDA), numpy and Python generator states, as tensors and plain values only, so the
    checkpoint still loads with `weights_only=True`."""
    kind, keys, pos, has_gauss, gauss = np.random.get_state(legacy=True)
    assert isinstance(keys, np.ndarray)  # the legacy tuple: ("MT19937", keys, pos, has_gauss, gauss)
    version, state, python_gauss = random.getstate()
    return {
        "torch": torch.get_rng_state(),
        "torch.cuda": torch.cuda.get_rng_state_all() if torch.cuda.is_available() else [],
        "numpy": {
            "keys": torch.from_numpy(keys.astype(np.int64)),
            "pos": pos,
            "has_gauss": has_gauss,
            "gauss": gauss,
        },
        "python": {"version": version, "state": list(state), "gauss": python_gauss},
    }


def set_rng_states(states: dict[str, Any]) -> None:
    """Inverse of `collect_rng_states`. CUDA states are restored only onto the same number of devices."""
    torch.set_rng_state(states["torch"])
    cuda = states.get("torch.cuda") or []
    if cuda and torch.cuda.is_available() and len(cuda) == torch.cuda.device_count():
        torch.cuda.set_rng_state_all(cuda)
    n = states["numpy"]
    np.random.set_state(
        ("MT19937", n["keys"].numpy().astype(np.uint32), n["pos"], n["has_gauss"], n["gauss"])
    )
    p = states["python"]
    random.setstate((p["version"], tuple(p["state"]), p["gauss"]))


def gather_by_rank(states: dict[str, Any]) -> dict[int, dict[str, Any]]:
    """Every process's `states`, keyed by global rank (a collective: every process calls it at the same point)."""
    if not (torch.distributed.is_available() and torch.distributed.is_initialized()):
        return {0: states}
    gathered: list[Any] = [None] * torch.distributed.get_world_size()
    torch.distributed.all_gather_object(gathered, states)
    return dict(enumerate(gathered))


class RNGState(Callback):
    """Saves every process's global RNG states in each checkpoint; each restores its own when training resumes.

    The states are applied at `on_fit_start`: after the model is built and the checkpoint is read, and before
    Lightning creates the first training iterator, with nothing random in between (the sanity check runs in
    `isolate_rng`; loaders seed their workers from a generator of their own and the training order is a
    function of the seed and the epoch, see `project.data.samplers`). The on-device augmentation draws from
    the global generator of the batch's device (CPU, or each CUDA device's), which these states include, so a
    resumed run draws exactly the numbers the uninterrupted run draws, in the same order. A process whose rank
    the checkpoint has no state for (a run continued on more processes) takes rank 0's.
    """

    def __init__(self) -> None:
        self._pending: dict[str, Any] | None = None

    def state_dict(self) -> dict[str, Any]:
        # Lightning asks every process for its callbacks' states as it writes a checkpoint (rank 0 writes it).
        return {"ranks": gather_by_rank(collect_rng_states())}

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        self._pending = state_dict

    def on_fit_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        if self._pending is None:
            return
        by_rank = self._pending.get("ranks", {0: self._pending})  # a checkpoint from before per-rank states
        set_rng_states(by_rank.get(trainer.global_rank, by_rank[0]))
        self._pending = None
