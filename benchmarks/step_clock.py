"""Timing marks for whole-process benchmarks (no Lightning import: the plain loops use them too, and must not pay
for Lightning's imports): when the first training step began, counted from the moment the
process was started (interpreter start-up and imports included), and the steady-state rate after it."""

import json
import os
import time


def process_age() -> float:
    """Seconds since this process was created (from /proc: the kernel's own start time)."""
    with open("/proc/self/stat") as f:
        start_ticks = int(f.read().rsplit(")", 1)[1].split()[19])
    with open("/proc/uptime") as f:
        uptime = float(f.read().split()[0])
    return uptime - start_ticks / os.sysconf("SC_CLK_TCK")


class StepClock:
    """Call `step(batch_size)` at the start of each training step: reports the first step's time since process
    start and the images/s over the steps from `warmup` on."""

    def __init__(self, warmup: int = 100) -> None:
        self.warmup, self.steps, self.images = warmup, 0, 0
        self.first_step_s: float | None = None
        self.timed_from: float | None = None

    def step(self, batch_size: int) -> None:
        if self.steps == 0:
            self.first_step_s = process_age()
        if self.steps == self.warmup:
            self.timed_from = time.perf_counter()
        elif self.steps > self.warmup:
            self.images += batch_size
        self.steps += 1

    def report(self, **extra: object) -> None:
        seconds = time.perf_counter() - self.timed_from if self.timed_from else float("nan")
        rate = self.images / seconds if self.timed_from else float("nan")
        record = {"first_step_s": round(self.first_step_s or float("nan"), 3), "images_per_s": round(rate, 1)}
        print("CLOCK " + json.dumps({**record, "steps": self.steps, **extra}), flush=True)
