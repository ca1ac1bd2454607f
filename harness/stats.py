"""Percentiles as the benchmarks and the load test print them."""

from __future__ import annotations

import statistics


def summary(values: list[float], digits: int = 1) -> dict[str, float]:
    """Count, nearest-rank p50/p90/p99, max and mean of ``values`` (any order)."""
    if not values:
        return {}
    ordered = sorted(values)

    def pct(p: float) -> float:
        return round(ordered[min(len(ordered) - 1, int(p / 100 * len(ordered)))], digits)

    return {"n": len(ordered), "p50": pct(50), "p90": pct(90), "p99": pct(99),
            "max": round(ordered[-1], digits), "mean": round(statistics.fmean(ordered), digits)}
