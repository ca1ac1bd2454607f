"""Small pure helpers of the dashboard: percentiles and the way numbers and times read."""

from __future__ import annotations

import math
from collections.abc import Iterable
from datetime import UTC, datetime, timedelta
from typing import Any

from functions.domain.catalog import human_bytes


def percentile(values: Iterable[float], p: float) -> float | None:
    """The nearest-rank ``p``-th percentile (0 < p <= 100): always an observed value.

    Nearest rank rather than interpolation: a p95 of 12.3 s means a workspace really took
    12.3 s, and an admin can find it. None for no values.
    """
    ordered = sorted(values)
    if not ordered:
        return None
    if not 0 < p <= 100:
        raise ValueError(f"percentile must be in (0, 100], got {p}")
    return ordered[max(0, math.ceil(p / 100 * len(ordered)) - 1)]


def aware(value: Any) -> datetime | None:
    """A Firestore timestamp (or an ISO string) as an aware datetime; None otherwise."""
    if isinstance(value, str):
        try:
            value = datetime.fromisoformat(value.replace("Z", "+00:00"))
        except ValueError:
            return None
    if not isinstance(value, datetime):
        return None
    return value if value.tzinfo else value.replace(tzinfo=UTC)


def when(value: Any) -> str:
    """``2025-06-10 14:03 UTC`` or an empty string."""
    moment = aware(value)
    return f"{moment.astimezone(UTC):%Y-%m-%d %H:%M} UTC" if moment else ""


def span(delta: timedelta | None) -> str:
    """A duration for people, two units at most: ``3d 4h``, ``2h 5m``, ``40s``."""
    if delta is None:
        return ""
    seconds = int(delta.total_seconds())
    sign = "-" if seconds < 0 else ""
    seconds = abs(seconds)
    days, rest = divmod(seconds, 86400)
    hours, rest = divmod(rest, 3600)
    minutes, secs = divmod(rest, 60)
    if days:
        return f"{sign}{days}d {hours}h"
    if hours:
        return f"{sign}{hours}h {minutes}m"
    if minutes:
        return f"{sign}{minutes}m {secs}s"
    return f"{sign}{secs}s"


def ago(value: Any, now: datetime) -> str:
    """How long before ``now`` a timestamp was: ``3h 5m ago``; empty if unknown."""
    moment = aware(value)
    if moment is None:
        return ""
    return f"{span(now - moment)} ago" if moment <= now else f"in {span(moment - now)}"


def until(value: Any, now: datetime) -> str:
    moment = aware(value)
    if moment is None:
        return ""
    return f"in {span(moment - now)}" if moment > now else f"{span(now - moment)} ago"


def seconds_ms(ms: Any) -> str:
    """Milliseconds as seconds for people: ``12.3 s``; empty for None."""
    if not isinstance(ms, int | float) or isinstance(ms, bool):
        return ""
    return f"{ms / 1000:.1f} s"


def size(n: Any) -> str:
    """Bytes for people (binary units): ``1.5Gi``; ``0`` for nothing."""
    if not isinstance(n, int | float) or isinstance(n, bool):
        return ""
    return human_bytes(int(n))


def usd(amount: Any) -> str:
    """``$1,234.56``; empty for a missing amount."""
    if not isinstance(amount, int | float) or isinstance(amount, bool):
        return ""
    return f"${amount:,.2f}"


def number(value: Any, digits: int = 1) -> str:
    if not isinstance(value, int | float) or isinstance(value, bool):
        return ""
    if isinstance(value, int):
        return f"{value:,}"
    return f"{value:,.{digits}f}"
