"""The function host's catalog cache (``functions.bootstrap``) on the Firestore emulator: a
catalog applied within the cache's TTL is read when a handler asks for what only it has
(``functions.ports.catalog_knowing``), and a stream of such asks reads at most once a second.
"""

from __future__ import annotations

import copy
import time
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import yaml
from google.cloud import firestore

from functions import bootstrap
from functions.ports import catalog_knowing

ROOT = Path(__file__).resolve().parents[2]
CONFIG = yaml.safe_load((ROOT / "examples" / "stasis.yaml").read_text())


def _apply(db: firestore.Client, config: dict[str, Any]) -> None:
    db.collection("catalog").document("current").set(config)


def test_a_catalog_applied_within_the_ttl_is_read_when_asked_at_most_once_a_second(
        emulator_env: dict[str, str], project_id: str) -> None:
    db = firestore.Client(project=project_id)
    _apply(db, CONFIG)
    cache = bootstrap._CatalogCache(db)
    source = SimpleNamespace(catalog=cache.get, refresh_catalog=cache.refresh)
    assert "cpu-quick" not in cache.get().profiles

    applied = copy.deepcopy(CONFIG)
    applied["profiles"].append({**CONFIG["profiles"][0], "id": "cpu-quick"})
    next(t for t in applied["teams"] if t["id"] == "ml-a")["profiles"].append("cpu-quick")
    _apply(db, applied)
    assert "cpu-quick" not in cache.get().profiles  # within the TTL: the cached copy

    def knows_quick(catalog: Any) -> bool:
        return bool(catalog.knows(team="ml-a", profile="cpu-quick"))

    # Read a second ago or less: asking reads nothing yet; a second later it reads.
    read_at = cache.read_at
    if time.monotonic() - read_at <= bootstrap.CATALOG_REFRESH_SECONDS:
        assert not knows_quick(catalog_knowing(source, knows_quick))
        assert cache.read_at == read_at
        time.sleep(bootstrap.CATALOG_REFRESH_SECONDS - (time.monotonic() - read_at) + 0.05)
    assert knows_quick(catalog_knowing(source, knows_quick))
    assert cache.read_at > read_at
    assert "cpu-quick" in cache.get().profiles  # and the cached copy is the applied one now

    # A profile nobody applied: the first ask reads (if a second has passed), the rest of
    # the second's asks do not.
    time.sleep(bootstrap.CATALOG_REFRESH_SECONDS + 0.05)
    reads = []
    for _ in range(20):
        before = cache.read_at
        catalog_knowing(source, lambda c: c.knows(profile="cpu-huge"))
        reads.append(cache.read_at != before)
    assert reads[0] and not any(reads[1:])
