"""Accuracy and speed of several runtimes, measured side by side.

Speed is measured interleaved: each repeat runs every variant once, in turn, so a burst of load from
another process on a shared CPU slows all variants alike instead of whichever ran at that moment.
Each figure is the median of the repeats, after warm-up runs (first-call allocations, kernel selection).
"""

import time
from collections.abc import Iterable, Mapping

import numpy as np

from project.export.runtimes import Runtime


def time_interleaved(
    runtimes: Mapping[str, Runtime], x: np.ndarray, warmup: int = 3, repeats: int = 20
) -> dict[str, float]:
    """Median seconds per call of each runtime on input `x`."""
    for _ in range(warmup):
        for run in runtimes.values():
            run(x)
    times: dict[str, list[float]] = {name: [] for name in runtimes}
    for _ in range(repeats):
        for name, run in runtimes.items():
            start = time.perf_counter()
            run(x)
            times[name].append(time.perf_counter() - start)
    return {name: float(np.median(t)) for name, t in times.items()}


def speed(
    runtimes: Mapping[str, Runtime],
    sample: np.ndarray,
    batch_size: int = 64,
    warmup: int = 3,
    repeats: int = 20,
) -> dict[str, dict[str, float]]:
    """Latency at batch 1 (ms, median) and throughput at `batch_size` (images/s, from the median batch time).

    `sample` is a real normalised batch; it is tiled up to `batch_size` if smaller.
    """
    reps = -(-batch_size // len(sample))
    batch = np.ascontiguousarray(np.concatenate([sample] * reps)[:batch_size])
    single = np.ascontiguousarray(sample[:1])
    latency = time_interleaved(runtimes, single, warmup, repeats)
    batch_time = time_interleaved(runtimes, batch, warmup, max(3, repeats // 2))
    return {
        name: {"latency_ms": 1000 * latency[name], "throughput": batch_size / batch_time[name]}
        for name in runtimes
    }


def accuracy(
    runtimes: Mapping[str, Runtime], batches: Iterable[tuple[np.ndarray, np.ndarray]], reference: str
) -> tuple[dict[str, dict[str, float]], int]:
    """Top-1 accuracy of each runtime on labelled batches, its top-1 agreement with `reference`, and the
    number of samples."""
    correct = dict.fromkeys(runtimes, 0)
    agree = dict.fromkeys(runtimes, 0)
    total = 0
    for x, y in batches:
        preds = {name: run(x).argmax(axis=1) for name, run in runtimes.items()}
        for name, pred in preds.items():
            correct[name] += int((pred == y).sum())
            agree[name] += int((pred == preds[reference]).sum())
        total += len(y)
    if total == 0:
        raise ValueError("no evaluation samples")
    return {
        name: {"accuracy": correct[name] / total, "agreement": agree[name] / total} for name in runtimes
    }, total
