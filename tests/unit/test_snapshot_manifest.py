"""The workspace manifest (runtime.snapshot.manifest.normalize_manifest) and the kernel
entry checks: pure validation and derived totals, no storage."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

import pytest

from runtime.snapshot import FORMAT, ManifestError
from runtime.snapshot.errors import CaptureFailed, RestoreFailed, SnapshotIntegrityError
from runtime.snapshot.inkernel import check_entry
from runtime.snapshot.kernels import _progress_from, _remote_error
from runtime.snapshot.manifest import (
    manifest_name,
    manifest_parts,
    normalize_manifest,
    reusable_parts,
)

NOW = datetime(2025, 3, 1, 12, 0, tzinfo=UTC)


def entry(kernel_id: str = "k-1", pool: str = "team/ws/_parts") -> dict[str, Any]:
    return {
        "format": FORMAT,
        "kernel_id": kernel_id,
        "segments": [10, 30],
        "objects": [
            {"name": f"{pool}/{'a' * 64}", "offset": 0, "bytes": 10, "blake3": "a" * 64},
            {"name": f"{pool}/{'b' * 64}", "offset": 10, "bytes": 30, "blake3": "b" * 64},
        ],
        "variables": [{"name": "x", "type": "int", "bytes": 5}],
        "skipped": [{"name": "lock", "type": "_thread.lock", "reason": "TypeError: no"}],
        "total_bytes": 40,
        "seconds": 1.25,
    }


def manifest(*entries: dict[str, Any], **extra: Any) -> dict[str, Any]:
    return {
        "kernels": [
            {"kernel_id": e["kernel_id"], "kernelspec": "python3", "entry": e} for e in entries
        ],
        "sessions": [{"path": "a.ipynb", "kernel_id": "k-1"}],
        **extra,
    }


def test_totals_skipped_format_and_created_at_are_derived() -> None:
    doc = normalize_manifest(
        manifest(entry("k-1"), entry("k-2"), workspace="ws"), prefix="team/ws/s1", now=NOW
    )
    assert doc["format"] == FORMAT == "stasis.kernel/2"
    assert doc["method"] == "kernel"
    assert doc["created_at"] == "2025-03-01T12:00:00Z"
    assert doc["workspace"] == "ws"
    assert doc["totals"] == {
        "kernels": 2, "objects": 4, "bytes": 80, "variables": 2, "skipped": 2,
        "uploaded_bytes": 80, "seconds": 2.5,
    }  # fmt: skip
    assert doc["skipped"] == [
        {"kernel_id": "k-1", "name": "lock", "type": "_thread.lock", "reason": "TypeError: no"},
        {"kernel_id": "k-2", "name": "lock", "type": "_thread.lock", "reason": "TypeError: no"},
    ]


def test_a_given_created_at_is_kept() -> None:
    doc = normalize_manifest(
        manifest(entry(), created_at="2024-01-01T00:00:00Z"), prefix="team/ws/s1", now=NOW
    )
    assert doc["created_at"] == "2024-01-01T00:00:00Z"


def test_a_workspace_without_kernels_is_a_valid_snapshot() -> None:
    doc = normalize_manifest({"kernels": []}, prefix="p", now=NOW)
    assert doc["totals"]["kernels"] == 0 and doc["sessions"] == [] and doc["skipped"] == []


@pytest.mark.parametrize(
    ("doc", "message"),
    [
        ({}, "needs a 'kernels' list"),
        ({"kernels": [], "format": "stasis.kernel/9"}, "not 'stasis.kernel/2'"),
        (manifest(entry(), entry()), "appears twice"),
        (manifest(entry(pool="team/other-ws/_parts")), "outside"),
        (
            {"kernels": [{"kernel_id": "k-1", "kernelspec": "python3", "entry": entry("k-2")}]},
            "carries the entry",
        ),
        ({"kernels": [{"kernel_id": "k-1", "entry": entry()}]}, "kernelspec"),
        ({"kernels": [], "sessions": ["a.ipynb"]}, "sessions"),
    ],
)
def test_bad_manifests_are_refused_with_the_reason(doc: dict[str, Any], message: str) -> None:
    with pytest.raises(ManifestError, match=message):
        normalize_manifest(doc, prefix="team/ws/s1", now=NOW)


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"format": "other/1"}, "format"),
        ({"segments": [10, -1]}, "segments"),
        ({"segments": [10, 31]}, "cover 40 bytes"),
        ({"objects": [{"name": "x", "offset": 0, "bytes": 40}]}, "no digest"),
        ({"placements": [None]}, "placements"),
    ],
)
def test_bad_entries_are_refused(change: dict[str, Any], message: str) -> None:
    with pytest.raises(ManifestError, match=message):
        check_entry({**entry(), **change})


def test_a_format_1_snapshot_with_parts_in_its_own_folder_is_still_valid() -> None:
    legacy = {**entry(), "format": "stasis.kernel/1", "objects": [
        {"name": "team/ws/s1/k-1/part-00000", "offset": 0, "bytes": 40, "sha256": "c" * 64}]}
    check_entry(legacy)
    doc = normalize_manifest(manifest(legacy), prefix="team/ws/s1", now=NOW)
    assert manifest_parts(doc) == {"team/ws/s1/k-1/part-00000": 40}
    assert reusable_parts(doc) == {}  # not in the pool: the next capture sends everything


def test_the_parts_of_a_snapshot_are_counted_once_and_offered_for_reuse() -> None:
    shared = entry("k-2")  # the same model loaded in two kernels: the same parts
    doc = normalize_manifest(manifest(entry("k-1"), shared), prefix="team/ws/s1", now=NOW)
    assert manifest_parts(doc) == {f"team/ws/_parts/{'a' * 64}": 10,
                                   f"team/ws/_parts/{'b' * 64}": 30}
    assert reusable_parts(doc) == {"a" * 64: 10, "b" * 64: 30}


def test_manifest_name() -> None:
    assert manifest_name("/team/ws/s1/") == "team/ws/s1/manifest.json"


def test_remote_errors_keep_their_class_or_end_with_the_last_traceback_line() -> None:
    traceback = [
        "\x1b[0;31m---------------------------------------------------------------\x1b[0m",
        "\x1b[0;31mModuleNotFoundError\x1b[0m  Traceback (most recent call last)",
        "\x1b[0;31mModuleNotFoundError\x1b[0m: No module named 'torch'",
    ]
    error = _remote_error(
        "restore",
        {
            "ename": "ModuleNotFoundError",
            "evalue": "No module named 'torch'",
            "traceback": traceback,
        },
    )
    assert isinstance(error, RestoreFailed)
    assert (
        str(error) == "restore failed in the kernel: ModuleNotFoundError: No module named 'torch'"
    )
    assert isinstance(_remote_error("capture", {"ename": "OSError", "evalue": "x"}), CaptureFailed)
    integrity = _remote_error("restore", {"ename": "SnapshotIntegrityError", "evalue": "object o"})
    assert isinstance(integrity, SnapshotIntegrityError) and "object o" in str(integrity)


def test_progress_lines_become_callbacks() -> None:
    seen: list[tuple[int, int]] = []
    _progress_from(
        "stasis-progress 5 10\nnoise\nstasis-progress 10 10\n", lambda d, t: seen.append((d, t))
    )
    assert seen == [(5, 10), (10, 10)]
