"""What the machine a command runs on offers, for any part of the package to ask."""

import os


def available_cpus() -> int:
    """CPUs this process may run on (respects taskset/cgroups, unlike os.cpu_count)."""
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1
