"""What every benchmark shares: the machine, memory, a median of timed runs, writing the JSON."""

from __future__ import annotations

import os
import platform
import resource
import statistics
import time
from pathlib import Path

import numpy as np


def machine() -> dict:
    cpu = platform.processor()
    try:
        for line in open("/proc/cpuinfo"):
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    return {"cpu": cpu, "cores": os.cpu_count(), "python": platform.python_version(), "numpy": np.__version__,
            "platform": platform.platform()}


def rss_mb() -> float:
    """Current resident memory in MiB (Linux), else peak."""
    try:
        for line in open("/proc/self/status"):
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    except OSError:
        pass
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def median_time(fn, repeats: int) -> tuple[float, list[float]]:
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times), times


def write_json(result: dict, out: str | Path) -> None:
    from isan.atomic import write_json_atomic

    write_json_atomic(out, result)
