"""How far a runtime operation has got: phase, bytes, rate and time left. Pure.

The runtime reports raw facts about the operation in flight on a workspace (the Runtime
port's ``progress(workspace_id)``; the local node agent's ``GET /workspaces/<id>/progress``):
which phase (``provision``, ``snapshot``, ``restore``), when it started, when its first
byte moved, the bytes moved so far and in all, and when it looked. :func:`describe` turns
them into what a waiting user reads: the same words in the portal's progress line and on
the CLI's progress bar (``stasis ws pause|resume|create --wait``).

The rate is measured from the first byte (a restore first starts a Jupyter server, which
moves nothing); the time left is the remaining bytes at that rate, and only once there is a
rate to speak of.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from functions.domain.catalog import human_bytes

#: What each phase is called where a user reads it.
PHASES: Mapping[str, str] = {"provision": "starting", "snapshot": "saving kernels",
                             "restore": "restoring kernels"}
#: Below this much transfer time a rate is noise: no rate and no time left yet.
MIN_RATE_SECONDS = 0.2


@dataclass(frozen=True)
class Progress:
    phase: str
    done_bytes: int = 0
    total_bytes: int = 0
    elapsed_seconds: float = 0.0
    rate_bytes_per_second: float | None = None
    seconds_left: float | None = None

    @property
    def fraction(self) -> float | None:
        """0..1 once the total is known."""
        return min(1.0, self.done_bytes / self.total_bytes) if self.total_bytes else None

    @property
    def line(self) -> str:
        """``saving kernels: 120 MiB of 256 MiB (47%), 80 MiB/s, about 2s left``."""
        words = PHASES.get(self.phase, self.phase)
        if not self.total_bytes:
            return f"{words} ({_seconds(self.elapsed_seconds)})"
        parts = [f"{words}: {human_bytes(self.done_bytes)} of {human_bytes(self.total_bytes)} "
                 f"({self.fraction or 0:.0%})"]
        if self.rate_bytes_per_second:
            parts.append(f"{human_bytes(int(self.rate_bytes_per_second))}/s")
        if self.seconds_left is not None:
            parts.append(f"about {_seconds(self.seconds_left)} left")
        return ", ".join(parts)

    def bar(self, width: int = 24) -> str:
        """``[#########...............]`` (the CLI's bar); empty brackets while the total
        is unknown."""
        filled = round((self.fraction or 0.0) * width)
        return "[" + "#" * filled + "." * (width - filled) + "]"

    def as_dict(self) -> dict[str, Any]:
        return {"phase": self.phase, "done_bytes": self.done_bytes,
                "total_bytes": self.total_bytes, "elapsed_seconds": round(self.elapsed_seconds, 3),
                "rate_bytes_per_second": self.rate_bytes_per_second,
                "seconds_left": self.seconds_left, "line": self.line}


def describe(raw: Mapping[str, Any] | None) -> Progress | None:
    """The user's view of a runtime's raw progress report, or None when nothing is in
    flight. ``raw``: ``{"phase", "started_at", "first_byte_at"?, "done_bytes",
    "total_bytes", "observed_at"}`` (times as Unix seconds)."""
    if not raw or not raw.get("phase"):
        return None
    observed = _float(raw.get("observed_at"))
    started = _float(raw.get("started_at"), observed)
    done, total = int(raw.get("done_bytes") or 0), int(raw.get("total_bytes") or 0)
    first = _float(raw.get("first_byte_at"), started)
    moving = max(0.0, observed - first)
    rate = done / moving if done and moving >= MIN_RATE_SECONDS else None
    left = (max(0, total - done) / rate) if rate and total else None
    return Progress(str(raw["phase"]), done, total, max(0.0, observed - started),
                    round(rate, 1) if rate else None, round(left, 1) if left is not None else None)


def _float(value: Any, default: float = 0.0) -> float:
    return float(value) if isinstance(value, int | float) and not isinstance(value, bool) \
        else default


def _seconds(value: float) -> str:
    seconds = round(value)
    return f"{seconds // 60}m {seconds % 60}s" if seconds >= 60 else f"{seconds}s"
