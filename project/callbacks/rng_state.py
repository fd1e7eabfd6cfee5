"""`RNGState`: the global random number generators travel with every checkpoint.

Lightning restores the model, optimizer, schedulers, loops and callbacks on resume, but not the random
generators: a resumed run restarts them from `seed_everything`, so it shuffles and augments the next epochs
differently from the run it continues. With this callback a run resumed from an end-of-epoch checkpoint
draws exactly the numbers the uninterrupted run would have drawn.
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
    kind, keys, pos, has_gauss, gauss = np.random.get_state()
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


class RNGState(Callback):
    """Saves the global RNG states in each checkpoint; restores them when training resumes from one.

    The states are applied at `on_fit_start`: after the model is built and the checkpoint is read, and before
    Lightning creates the first training iterator (which draws the shuffling seed from the global generator),
    with nothing random in between (the sanity check runs in `isolate_rng`). A run resumed from an
    end-of-epoch checkpoint then shuffles and augments exactly like the uninterrupted run. From a mid-epoch
    checkpoint, the rest of that epoch is a fresh shuffle (the DataLoader is not resumable mid-epoch). With
    several processes, each restores the state saved by rank 0.
    """

    def __init__(self) -> None:
        self._pending: dict[str, Any] | None = None

    def state_dict(self) -> dict[str, Any]:
        return collect_rng_states()

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        self._pending = state_dict

    def on_fit_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        if self._pending is not None:
            set_rng_states(self._pending)
            self._pending = None
