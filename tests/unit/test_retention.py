"""Snapshot retention and orphans (pure): max age, keep-last-N, the team's bytes cap, the
snapshot a workspace resumes from, and orphans both ways. Against the example catalog:
cpu-small keeps 5 snapshots for 30 days; team ml-b overrides max age to 7 days; ml-a may
hold 50 GiB of snapshots, ml-b 20 GiB.
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from pathlib import Path

import yaml

from functions.domain.catalog import Catalog
from functions.domain.lifecycle import State, Workspace
from functions.domain.retention import (
    ExpiryReason,
    SnapshotRecord,
    StoredPart,
    StoredSnapshot,
    deletable_parts,
    deletes_with_workspace,
    find_orphans,
    held_bytes,
    may_expire,
    parse_object_name,
    parse_part_name,
    part_names,
    plan,
    snapshot_prefix,
    unshared_bytes,
)

CONFIG = yaml.safe_load(
    (Path(__file__).resolve().parents[2] / "examples" / "stasis.yaml").read_text())
CATALOG = Catalog.from_config(CONFIG)
NOW = datetime(2026, 3, 10, 12, 0, tzinfo=UTC)
GIB = 2**30


def ws(name: str = "nb", *, team: str = "ml-a", state: State = State.PAUSED,
       current: str | None = None, pending: str | None = None) -> Workspace:
    return Workspace(id=f"{team}--{name}", team=team, owner="alice", name=name,
                     profile="cpu-small", state=state, current_snapshot=current,
                     pending_snapshot=pending)


def rec(version: int, *, name: str = "nb", team: str = "ml-a", days_old: float = 1,
        size: int = GIB, status: str = "ready", expires_in_days: float | None = None
        ) -> SnapshotRecord:
    created = NOW - timedelta(days=days_old)
    return SnapshotRecord(
        id=f"{team}--{name}-v{version}", workspace_id=f"{team}--{name}", team=team, bytes=size,
        created_at=created, status=status, profile="cpu-small",
        expires_at=NOW + timedelta(days=expires_in_days) if expires_in_days is not None
        else created + timedelta(days=30))


def reasons(result) -> dict[str, ExpiryReason]:  # type: ignore[no-untyped-def]
    return {e.record.id: e.reason for e in result.expiries}


def test_max_age_expires_old_snapshots_but_never_the_current_one() -> None:
    records = [rec(2, days_old=40), rec(4, days_old=35), rec(6, days_old=2)]
    result = plan(records, {"ml-a--nb": ws(current="ml-a--nb-v4")}, CATALOG, NOW)
    assert reasons(result) == {"ml-a--nb-v2": ExpiryReason.MAX_AGE}
    [kept] = result.kept
    assert kept.record.id == "ml-a--nb-v4" and kept.would_be == ExpiryReason.MAX_AGE
    assert "resume restores" in kept.why


def test_the_ttl_field_and_a_tightened_policy_both_count() -> None:
    # expires_at says tomorrow, but ml-b's override keeps snapshots 7 days: 8 days old goes.
    records = [rec(2, team="ml-b", days_old=8, expires_in_days=1),
               rec(4, days_old=3, expires_in_days=-0.5)]  # its TTL field already passed
    result = plan(records, {}, CATALOG, NOW)
    assert {e.reason for e in result.expiries} == {ExpiryReason.WORKSPACE_DELETED}
    live = {"ml-b--nb": ws(team="ml-b"), "ml-a--nb": ws()}
    assert reasons(plan(records, live, CATALOG, NOW)) == {
        "ml-b--nb-v2": ExpiryReason.MAX_AGE, "ml-a--nb-v4": ExpiryReason.MAX_AGE}


def test_keep_last_n_keeps_the_newest_per_workspace() -> None:
    records = [rec(v, days_old=10 - v) for v in range(1, 9)]  # v8 is the newest
    records += [rec(v, name="other", days_old=10 - v) for v in range(1, 4)]
    result = plan(records, {"ml-a--nb": ws(current="ml-a--nb-v8"),
                            "ml-a--other": ws("other")}, CATALOG, NOW)
    assert reasons(result) == {f"ml-a--nb-v{v}": ExpiryReason.KEEP_LAST for v in (1, 2, 3)}
    assert "keeps its last 5; this is number 8" in next(
        e.message for e in result.expiries if e.record.id == "ml-a--nb-v1")


def test_the_team_bytes_cap_expires_the_oldest_first() -> None:
    # ml-b may hold 20 GiB: 3 workspaces x 8 GiB = 24 GiB -> the oldest unprotected goes.
    records = [rec(2, name=n, team="ml-b", days_old=d, size=8 * GIB)
               for n, d in (("a", 3), ("b", 2), ("c", 1))]
    live = {f"ml-b--{n}": ws(n, team="ml-b", current=f"ml-b--{n}-v2" if n == "a" else None)
            for n in "abc"}
    result = plan(records, live, CATALOG, NOW)
    # a is the oldest but protected (current of a paused workspace): b goes instead.
    assert reasons(result) == {"ml-b--b-v2": ExpiryReason.TEAM_BYTES}
    assert "more than its 20Gi" in result.expiries[0].message
    assert result.over_cap == {}


def test_over_the_cap_with_only_protected_snapshots_is_reported() -> None:
    records = [rec(2, name=n, team="ml-b", size=12 * GIB) for n in "ab"]
    live = {f"ml-b--{n}": ws(n, team="ml-b", current=f"ml-b--{n}-v2") for n in "ab"}
    result = plan(records, live, CATALOG, NOW)
    assert result.expiries == [] and result.over_cap == {"ml-b": 4 * GIB}


def test_snapshots_of_a_deleted_workspace_go_unless_the_policy_keeps_them() -> None:
    records = [rec(2), rec(3)]
    deleted = {"ml-a--nb": ws(state=State.DELETED, current=None)}
    assert set(reasons(plan(records, deleted, CATALOG, NOW)).values()) == {
        ExpiryReason.WORKSPACE_DELETED}
    config = {**CONFIG, "teams": [dict(t, retention={"delete_with_workspace": False})
                                  if t["id"] == "ml-a" else t for t in CONFIG["teams"]]}
    keeping = Catalog.from_config(config)
    assert not deletes_with_workspace(keeping, "ml-a", "cpu-small")
    assert deletes_with_workspace(CATALOG, "ml-a", "cpu-small")
    assert deletes_with_workspace(CATALOG, "ml-a", "a-profile-removed-since")
    assert plan(records, deleted, keeping, NOW).expiries == []


def test_expired_and_deleted_records_are_not_planned_again() -> None:
    records = [rec(2, days_old=40, status="expired"), rec(3, days_old=40, status="deleted")]
    assert plan(records, {"ml-a--nb": ws()}, CATALOG, NOW).expiries == []
    assert held_bytes([*records, rec(4)]) == {"ml-a": GIB}


def test_may_expire_is_the_handlers_last_check() -> None:
    current = rec(4)
    assert may_expire(None, None) == "no such snapshot record"
    assert may_expire(rec(2, status="expired"), ws()) == "already expired"
    assert "resume restores" in (may_expire(current, ws(current=current.id)) or "")
    assert "is writing" in (may_expire(current, ws(state=State.PAUSING, pending=current.id))
                            or "")
    assert may_expire(current, ws(state=State.DELETED, current=current.id)) is None
    assert may_expire(current, ws(current="ml-a--nb-v9")) is None


def stored(version: int, *, name: str = "nb", team: str = "ml-a",
           hours_old: float = 5) -> StoredSnapshot:
    return StoredSnapshot(team, f"{team}--{name}", f"{team}--{name}-v{version}", objects=3,
                          bytes=100, updated=NOW - timedelta(hours=hours_old))


def test_orphans_both_ways() -> None:
    records = [rec(2), rec(3), rec(4, status="expired"), rec(5, days_old=0.01),
               rec(6, name="gone"), rec(7, name="paused")]
    objects = [stored(2),                      # recorded: fine
               stored(4),                      # record expired, objects left: orphan
               stored(9),                      # never recorded: orphan
               stored(10, hours_old=0.2),      # too young: maybe being recorded right now
               stored(11, name="pausing"),     # the snapshot a PAUSING workspace writes
               stored(1, name="x", team="ml-b")]  # nobody knows it: orphan
    workspaces = {"ml-a--nb": ws(current="ml-a--nb-v2"),
                  "ml-a--pausing": ws("pausing", state=State.PAUSING, pending="ml-a--pausing-v11"),
                  "ml-a--paused": ws("paused", current="ml-a--paused-v7")}
    found = find_orphans(records, objects, workspaces, NOW)
    assert sorted(s.snapshot_id for s in found.objects) == [
        "ml-a--nb-v4", "ml-a--nb-v9", "ml-b--x-v1"]
    # v3 and gone-v6 have no objects; v5 is too young to judge; paused-v7 is current.
    assert sorted(e.record.id for e in found.records) == ["ml-a--gone-v6", "ml-a--nb-v3"]
    assert {e.reason for e in found.records} == {ExpiryReason.OBJECTS_MISSING}
    assert found.unresumable == [("ml-a--paused", "ml-a--paused-v7")]


def test_object_names_and_prefixes() -> None:
    assert snapshot_prefix("ml-a--nb", "ml-a--nb-v3") == "snapshots/ml-a/ml-a--nb/ml-a--nb-v3/"
    assert parse_object_name("snapshots/ml-a/ml-a--nb/ml-a--nb-v3/k1/part-00000") == (
        "ml-a", "ml-a--nb", "ml-a--nb-v3")
    assert parse_object_name("snapshots/ml-a/ml-a--nb/manifest.json") is None
    assert parse_object_name("sandboxes/ml-a/x/y/z") is None


# -- shared parts ---------------------------------------------------------------------------

MIB = 2**20
POOL = "snapshots/ml-a/ml-a--nb/_parts/"


def shared(version: int, parts: str, *, days_old: float = 1, status: str = "ready"
           ) -> SnapshotRecord:
    """A record whose parts are named by letters: ``"abc"`` uses parts a, b and c, each
    100 MiB (shared with every other record that names the same letter)."""
    import dataclasses

    return dataclasses.replace(rec(version, days_old=days_old, status=status),
                               bytes=len(parts) * 100 * MIB,
                               parts={f"_parts/{p}": 100 * MIB for p in parts})


def test_shared_parts_are_counted_once_and_released_when_no_snapshot_uses_them() -> None:
    v2, v4, v6 = shared(2, "abcd"), shared(4, "abce"), shared(6, "abcef")
    assert held_bytes([v2, v4, v6]) == {"ml-a": 6 * 100 * MIB}  # a b c d e f
    # Recording v6 after v2 and v4 adds only f; expiring v2 releases only d.
    assert unshared_bytes(v6, [v2, v4]) == 100 * MIB
    assert unshared_bytes(v2, [v4, v6]) == 100 * MIB
    assert unshared_bytes(v4, [v2, v6]) == 0  # everything it holds, another one holds too
    # Expired records hold nothing; a record of the older format holds its own bytes.
    assert unshared_bytes(v6, [shared(4, "abce", status="expired")]) == 5 * 100 * MIB
    assert held_bytes([v6, rec(8, size=GIB)]) == {"ml-a": 5 * 100 * MIB + GIB}


def test_a_part_is_deletable_only_when_unused_and_not_freshly_written() -> None:
    v4, v6 = shared(4, "ab"), shared(6, "bc", status="expired")
    old, fresh = NOW - timedelta(hours=3), NOW - timedelta(minutes=5)
    pool = [StoredPart("ml-a", "ml-a--nb", POOL + name, 100 * MIB, updated, 7)
            for name, updated in (("a", old), ("b", old), ("c", old), ("x", fresh))]
    deletable = deletable_parts(pool, [v4, v6], NOW)
    # a and b are v4's; c was only the expired v6's; x may be a capture in progress.
    assert [p.name for p in deletable] == [POOL + "c"]


def test_team_bytes_expire_what_frees_bytes_and_skip_what_is_all_shared() -> None:
    import dataclasses

    mlb = [dataclasses.replace(shared(v, parts, days_old=days), workspace_id="ml-b--nb",
                               team="ml-b", id=f"ml-b--nb-v{v}",
                               parts={f"_parts/{p}": 5 * GIB for p in parts})
           for v, parts, days in ((2, "ab", 5), (4, "ab", 4), (6, "abc", 3), (8, "cd", 2))]
    # ml-b may hold 20 GiB: a b c d = 20 GiB fits; add e and it does not.
    assert plan(mlb, {"ml-b--nb": ws(team="ml-b", current="ml-b--nb-v8")}, CATALOG,
                NOW).expiries == []
    mlb.append(dataclasses.replace(mlb[-1], id="ml-b--nb-v10", created_at=NOW,
                                   parts={"_parts/e": 5 * GIB}))
    result = plan(mlb, {"ml-b--nb": ws(team="ml-b", current="ml-b--nb-v10")}, CATALOG, NOW)
    # Oldest first, but only what frees bytes: v2, v4 and v6 hold nothing the others do
    # not (a, b, c), so expiring them would free nothing; v8 alone holds d.
    assert reasons(result) == {"ml-b--nb-v8": ExpiryReason.TEAM_BYTES}
    assert result.over_cap == {}


def test_a_record_whose_parts_are_gone_is_an_orphan_record() -> None:
    v4 = shared(4, "ab", days_old=2)
    stored = [StoredSnapshot("ml-a", "ml-a--nb", "ml-a--nb-v4", 1, 100)]
    parts = [StoredPart("ml-a", "ml-a--nb", POOL + "a", 100 * MIB)]
    orphans = find_orphans([v4], stored, {}, NOW, parts=parts)
    assert [(e.record.id, e.message) for e in orphans.records] == [
        ("ml-a--nb-v4", f"no objects at {POOL}b")]
    whole = [*parts, StoredPart("ml-a", "ml-a--nb", POOL + "b", 100 * MIB)]
    assert find_orphans([v4], stored, {}, NOW, parts=whole).records == []


def test_pool_objects_are_parts_not_snapshots() -> None:
    assert parse_object_name(POOL + "a1b2") is None
    assert parse_part_name(POOL + "a1b2") == ("ml-a", "ml-a--nb")
    assert parse_part_name("snapshots/ml-a/ml-a--nb/ml-a--nb-v2/manifest.json") is None
    assert part_names({POOL + "a1": 3, "elsewhere/x": 4}, "ml-a--nb") == {
        "_parts/a1": 3, "elsewhere/x": 4}


def test_a_pod_snapshots_objects_are_where_gke_wrote_them() -> None:
    from functions.domain import retention as r

    uri = "gs://stasis-snapshots/snapshots/ml-a/pod/3f2a9c"
    record = r.SnapshotRecord("ml-a--nb-v3", "ml-a--nb", "ml-a", bytes=5, uri=uri,
                              method="pod")
    assert record.prefix == "snapshots/ml-a/pod/3f2a9c/"
    kernel = r.SnapshotRecord("ml-a--nb-v5", "ml-a--nb", "ml-a", uri="gs://b/x")
    assert kernel.prefix == "snapshots/ml-a/ml-a--nb/ml-a--nb-v5/"
    assert r.pod_prefix("gs://b/elsewhere/ml-a/pod/x") is None
    assert r.stored_key("snapshots/ml-a/pod/3f2a9c/checkpoint/pages.img") == (
        "ml-a", "", "3f2a9c", "snapshots/ml-a/pod/3f2a9c/")
    assert r.stored_key("snapshots/ml-a/ml-a--nb/ml-a--nb-v5/manifest.json") == (
        "ml-a", "ml-a--nb", "ml-a--nb-v5", None)
    stored = [r.StoredSnapshot("ml-a", "", "3f2a9c", 2, 5, object_prefix=record.prefix),
              r.StoredSnapshot("ml-a", "", "0ld", 1, 1, object_prefix="snapshots/ml-a/pod/0ld/")]
    orphans = r.find_orphans([record], stored, {}, datetime(2030, 1, 1, tzinfo=UTC))
    assert [o.prefix for o in orphans.objects] == ["snapshots/ml-a/pod/0ld/"]
    assert orphans.records == []
