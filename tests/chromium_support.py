"""Debian's Chromium under Playwright, as every browser test launches it (never a browser
Playwright downloads). Importable from any test module (``tests/`` is on sys.path)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

CHROMIUM = Path("/usr/bin/chromium")
LAUNCH_ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
               "--disable-component-update", "--no-first-run", "--disable-sync"]


def launched() -> Iterator[Any]:
    """A module fixture's body: ``yield from launched()``."""
    from playwright.sync_api import sync_playwright

    with sync_playwright() as p:
        chromium = p.chromium.launch(executable_path=str(CHROMIUM), args=LAUNCH_ARGS)
        try:
            yield chromium
        finally:
            chromium.close()
