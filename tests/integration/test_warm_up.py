"""Warming an instance before its first delivery (``functions.bootstrap.warm``, which each
worker of the local stack's function host calls) and the node agent's publisher before its
first outcome (``PubSubPublisher.warm``), on the emulators: what the first workspace after a
start would otherwise wait for is built, and an endpoint not answering does not stop the
instance starting.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml
from google.cloud import firestore

from functions import bootstrap
from runtime.local.publisher import PubSubPublisher
from runtime.supervisor import free_port

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture
def fresh_deps(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Iterator[None]:
    """``bootstrap.deps()`` built anew for the test (on the null runtime), and forgotten."""
    monkeypatch.setenv("STASIS_RUNTIME", "null")
    monkeypatch.setenv("STASIS_DATA_DIR", str(tmp_path))
    bootstrap.deps.cache_clear()
    yield
    bootstrap.deps.cache_clear()


def test_warming_reads_the_catalog_the_first_admission_needs(
        emulator_env: dict[str, str], project_id: str, fresh_deps: None) -> None:
    config = yaml.safe_load((ROOT / "examples" / "stasis.yaml").read_text())
    firestore.Client(project=project_id).collection("catalog").document("current").set(config)

    bootstrap.warm()

    cache = bootstrap.deps().catalog.__self__  # type: ignore[attr-defined]
    assert cache.value is not None and cache.read_at > 0
    assert set(cache.value.profiles) == {p["id"] for p in config["profiles"]}


def test_an_instance_warmed_before_the_catalog_was_applied_reads_it_once_applied(
        emulator_env: dict[str, str], project_id: str, fresh_deps: None) -> None:
    # `stasis up` starts the function host, then seeds the catalog: within the cache's TTL
    # of the warm-up, the first request must see the applied teams, not "no team ml-a".
    bootstrap.warm()
    assert not bootstrap.deps().catalog().teams

    config = yaml.safe_load((ROOT / "examples" / "stasis.yaml").read_text())
    firestore.Client(project=project_id).collection("catalog").document("current").set(config)

    assert "ml-a" in bootstrap.deps().catalog().teams


def test_the_agent_publisher_connects_when_warmed(emulator_env: dict[str, str],
                                                   project_id: str) -> None:
    publisher = PubSubPublisher(project_id, origin="node_agent")
    assert publisher._client is None

    publisher.warm()

    assert publisher._client is not None


def test_a_publisher_warmed_with_no_pubsub_answering_logs_why_and_returns(
        monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture) -> None:
    monkeypatch.setenv("PUBSUB_EMULATOR_HOST", f"127.0.0.1:{free_port()}")  # nobody listens
    publisher = PubSubPublisher("stasis-nobody", origin="node_agent")
    began = time.monotonic()

    with caplog.at_level(logging.WARNING, logger="runtime.local.publisher"):
        publisher.warm(timeout=1.0)

    assert time.monotonic() - began < 30  # bounded by its timeout, not left hanging
    assert any("warming the Pub/Sub client failed" in r.getMessage() for r in caplog.records)
