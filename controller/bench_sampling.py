"""How the benchmarks sample and summarise: round-robin timing of several cases (:func:`interleave`) and
the p50/p95 of a list of times (:func:`percentiles`).

Shared by :mod:`controller.bench` and :mod:`controller.bench_console`, which both build on it; it imports
neither (standard library only).
"""

from __future__ import annotations

import math
import statistics
import time
from collections.abc import Callable
from typing import Any


def percentiles(samples: list[float]) -> dict[str, float]:
    """p50 (median) and p95 (nearest rank: the ceil(0.95 n)-th smallest) of ``samples`` in ms, rounded
    to 0.01 ms; ``n`` the number of samples."""
    ordered = sorted(samples)
    rank = max(1, math.ceil(0.95 * len(ordered)))
    return {"p50": round(statistics.median(ordered), 2), "p95": round(ordered[rank - 1], 2), "n": len(ordered)}


def interleave(cases: dict[Any, tuple[Callable[[int], Any], int]], warmup: int = 1) -> dict[Any, list[float]]:
    """Time ``fn(i)`` of every case round-robin: ``warmup`` unmeasured rounds, then sample i of each case
    (that wants more than i samples) before sample i + 1 of any. Returns the samples (ms) per case."""
    for i in range(warmup):
        for fn, _ in cases.values():
            fn(i)
    samples: dict[Any, list[float]] = {key: [] for key in cases}
    for i in range(max((n for _, n in cases.values()), default=0)):
        for key, (fn, n) in cases.items():
            if i < n:
                start = time.perf_counter()
                fn(i)
                samples[key].append((time.perf_counter() - start) * 1000.0)
    return samples
