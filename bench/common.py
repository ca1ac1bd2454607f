"""What the benchmark scripts share (imported as a sibling: ``python bench/X.py``)."""

from __future__ import annotations

import contextlib
import os
import tempfile
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from harness.stats import summary

__all__ = ["private_stack", "summary"]


@contextlib.contextmanager
def private_stack(runtime: str = "null", *,
                  host_env: Any = None) -> Iterator[tuple[Any, Any]]:
    """A local stack of its own for the block (a new project and data dir, every port free
    and away from the defaults), next to a developer's running one: (settings, the
    report of `stasis up`). Stopped as `stasis down` stops it, whatever the block raised.
    ``host_env(settings)``: what to lay over the function host's environment."""
    from stack import local, processes
    from stack.settings import Settings

    settings = processes.on_free_ports(Settings(project=f"bench-{uuid.uuid4().hex[:8]}",
                                                data_dir=Path(tempfile.mkdtemp()) / "stack"))
    os.environ.update(settings.emulator_env())
    report = local.up(settings, runtime=runtime,
                      host_env=host_env(settings) if host_env else None)
    try:
        yield settings, report
    finally:
        local.down(settings, pause=False)
