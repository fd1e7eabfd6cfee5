"""Callbacks: extra behaviour around training, attached through Lightning hooks only.

Grouped like `configs/`: the default ones here (checkpoints, predictions, effective batch size),
`diagnostics/` (on by default: gradient norms, the non-finite guard, data wait; opt-in: update ratios,
throughput), `tuning/` (LR and batch-size finders), `debug/` (CUDA memory, profiler); training aids of
particular recipes beside them (`PatchWhiteningInit`, `Lookahead`). An optional part's callbacks live in the
part, and its configs name them by their full path (`class_path: <package>.<part>.<module>.<Class>`).

A `fit` imports only the callbacks it always uses. The others are optional extras, listed in `OPTIONAL`: a config
names them by class alone (`class_path: ProgressivePruning`), and `import_named` imports the ones a command line
or config names before it is parsed; `from project.callbacks import X` works for every one of them.
"""

import importlib
import re
from collections.abc import Iterable
from typing import Any

from project.callbacks.checkpoint import BestAndLastCheckpoint
from project.callbacks.diagnostics.data_wait import DataWaitMonitor
from project.callbacks.diagnostics.grad_norm import GradientNormMonitor
from project.callbacks.diagnostics.nonfinite import NonFiniteError, NonFiniteGuard
from project.callbacks.effective_batch_size import EffectiveBatchSize
from project.callbacks.prediction_writer import PredictionWriter
from project.callbacks.preemption import StopAndRequeue, StopTogether

#: Callbacks imported only when a config or command names them: class name -> module.
OPTIONAL = {
    "CUDAMemoryRecorder": f"{__name__}.debug.memory",
    "ScheduledProfiler": f"{__name__}.debug.profiler",
    "ImageThroughputMonitor": f"{__name__}.diagnostics.throughput",
    "UpdateRatioMonitor": f"{__name__}.diagnostics.update_ratio",
    "Lookahead": f"{__name__}.lookahead",
    "MaxBatchSizeFinder": f"{__name__}.tuning.batch_size_finder",
    "LRFinder": f"{__name__}.tuning.lr_finder",
    "PatchWhiteningInit": f"{__name__}.whitening",
}


def import_named(texts: Iterable[str]) -> None:
    """Import the optional callbacks whose class name appears in `texts` (a command line, config files), so
    that jsonargparse finds them by their short name."""
    text = "\n".join(texts)
    for name, module in OPTIONAL.items():
        if re.search(rf"\b{name}\b", text):
            importlib.import_module(module)


def __getattr__(name: str) -> Any:
    if name in OPTIONAL:
        return getattr(importlib.import_module(OPTIONAL[name]), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


# The optional ones (OPTIONAL) are importable from here too, through __getattr__.
__all__ = [
    "BestAndLastCheckpoint",
    "DataWaitMonitor",
    "EffectiveBatchSize",
    "GradientNormMonitor",
    "NonFiniteError",
    "NonFiniteGuard",
    "PredictionWriter",
    "StopAndRequeue",
    "StopTogether",
]
