"""The workspace state machine, as a table: every state (and "no document") x every signal.

Each state has one canonical document (``DOCS``), the one the usual history leaves behind:

    created v1 -> ready v2 -> pause v3 (snapshot ws-v3 pending) -> paused v4 (current ws-v3)
    -> resume v5 -> FAILED v6 by a resume failure (keeps ws-v3);
    DELETING v4 is a delete that arrived while PAUSING (ws-v3 still pending), DELETED v5.

Snapshot signals name ``ws-v3`` ("matching": the pending one, or the current one after it
was recorded) or ``ws-v1`` ("other": a stale or out-of-order one). ``TABLE`` is written out
in full because it *is* the documentation of the state machine; a test checks it covers the
whole cross product. Focused tests below cover what one row cannot show.
"""

from __future__ import annotations

import dataclasses
import itertools
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from events import (
    InvalidEvent,
    SnapshotFinished,
    WorkspaceDeleteRequested,
    WorkspacePauseRequested,
    WorkspacePreempted,
    WorkspaceReady,
    WorkspaceRequested,
    WorkspaceResumeRequested,
    WorkspaceRuntimeAlert,
    WorkspaceRuntimeFailed,
    new_event,
)
from events.payloads import WorkspaceScheduled
from functions.domain.lifecycle import (
    HOLDS_HARDWARE,
    HOLDS_SLOT,
    IN_TRANSITION,
    NOTES,
    Decision,
    Destroy,
    DiscardSnapshot,
    Provision,
    Reason,
    Release,
    Restore,
    RuntimeDestroyed,
    Snapshot,
    State,
    Workspace,
    decide,
    refuse_admission,
    snapshot_id_for,
)

T0 = datetime(2025, 6, 10, 9, 0, tzinfo=UTC)
NOW = datetime(2025, 6, 10, 12, 0, tzinfo=UTC)
WS = "ml-a--ws"
MATCHING = "ml-a--ws-v3"
OTHER = "ml-a--ws-v1"

_BASE = Workspace(id=WS, team="ml-a", owner="alice", name="ws", profile="gpu-small",
                  created_at=T0, reply_to="slack:C1")

DOCS: dict[State | None, Workspace | None] = {
    None: None,
    State.REQUESTED: _BASE,
    # QUEUED: a resume waiting its turn (preempted by pause, say), its snapshot kept.
    State.QUEUED: dataclasses.replace(
        _BASE, state=State.QUEUED, state_reason="requeued", version=5,
        current_snapshot=MATCHING, queued_at=T0, queued_for="resume"),
    State.PROVISIONING: dataclasses.replace(
        _BASE, state=State.PROVISIONING, state_reason="created", version=1,
        transition_started_at=T0),
    State.RUNNING: dataclasses.replace(
        _BASE, state=State.RUNNING, state_reason="ready", version=2, url="http://ws",
        runtime_handle="local:1", first_start_ms=4000),
    State.PAUSING: dataclasses.replace(
        _BASE, state=State.PAUSING, state_reason="pause_started", version=3, url="http://ws",
        runtime_handle="local:1", pending_snapshot=MATCHING, transition_started_at=T0,
        pause_cause="user"),
    State.PAUSED: dataclasses.replace(
        _BASE, state=State.PAUSED, state_reason="paused", version=4, runtime_handle="local:1",
        current_snapshot=MATCHING, last_pause_ms=9000),
    State.RESUMING: dataclasses.replace(
        _BASE, state=State.RESUMING, state_reason="resume_started", version=5,
        runtime_handle="local:1", current_snapshot=MATCHING, transition_started_at=T0),
    State.DELETING: dataclasses.replace(
        _BASE, state=State.DELETING, state_reason="delete_started", version=4,
        pending_snapshot=MATCHING, transition_started_at=T0),
    State.DELETED: dataclasses.replace(
        _BASE, state=State.DELETED, state_reason="deleted", version=5),
    State.FAILED: dataclasses.replace(
        _BASE, state=State.FAILED, state_reason="resume_failed", state_message="no node",
        version=6, current_snapshot=MATCHING),
}

SIGNALS: dict[str, Any] = {
    "requested": WorkspaceRequested("ml-a", "alice", "ws", "gpu-small", reply_to="slack:C1"),
    "ready": WorkspaceReady(WS, "http://ws-new", "local:2"),
    "provision failed": WorkspaceRuntimeFailed(WS, "provision", "image pull failed"),
    "resume failed": WorkspaceRuntimeFailed(WS, "resume", "no node with nvidia-l4"),
    "pause": WorkspacePauseRequested(WS, "alice", "idle"),
    "snapshot ok": SnapshotFinished(WS, MATCHING, True, bytes=1024),
    "snapshot ok, other id": SnapshotFinished(WS, OTHER, True, bytes=1024),
    "snapshot failed": SnapshotFinished(WS, MATCHING, False, error="kernel died"),
    "resume": WorkspaceResumeRequested(WS, "alice"),
    "delete": WorkspaceDeleteRequested(WS, "alice"),
    "destroyed": RuntimeDestroyed(WS, 1024),
    # the scheduler's verdicts name a version: QUEUED's (5) or RUNNING's (2)
    "admit": WorkspaceScheduled(WS, 5, "admit", node="local"),
    "expire": WorkspaceScheduled(WS, 5, "expire", message="waited 4h, the most it may"),
    "preempt": WorkspaceScheduled(WS, 2, "preempt", for_workspace="ml-b--hi",
                                  message="paused for ml-b--hi"),
    "warn": WorkspaceScheduled(WS, 2, "warn", for_workspace="ml-b--hi", after_seconds=600,
                               message="will be paused in 10m"),
    "checkpoint": WorkspaceScheduled(WS, 2, "checkpoint"),
    "server lost": WorkspacePreempted(WS, "local", NOW.isoformat(), cause="server_lost"),
    # cluster monitoring (functions/domain/monitoring.py), between T0 and NOW
    "node lost": WorkspacePreempted(WS, "gke-pool-spot-1", "2025-06-10T11:00:00+00:00"),
    "runtime alert": WorkspaceRuntimeAlert(WS, "oom_killed", "2025-06-10T11:00:00+00:00",
                                           "container workspace was OOM-killed"),
}

S, R = State, Reason
_ = ()  # no commands
PROV, SNAP, REL, REST = (Provision,), (Snapshot,), (Release,), (Restore,)
DEST, DISC = (Destroy,), (DiscardSnapshot,)
OK, NO = True, False

# (state, signal): (accepted, state afterwards, reason, command types)
TABLE: dict[tuple[State | None, str], tuple[bool, State | None, Reason, tuple[type, ...]]] = {
    # -- no document: only a request creates one ----------------------------------------------
    (None, "requested"):                 (OK, S.PROVISIONING, R.CREATED, PROV),
    (None, "ready"):                     (NO, None, R.UNKNOWN_WORKSPACE, _),
    (None, "provision failed"):          (NO, None, R.UNKNOWN_WORKSPACE, _),
    (None, "resume failed"):             (NO, None, R.UNKNOWN_WORKSPACE, _),
    (None, "pause"):                     (NO, None, R.UNKNOWN_WORKSPACE, _),
    (None, "snapshot ok"):               (NO, None, R.UNKNOWN_WORKSPACE, DISC),
    (None, "snapshot ok, other id"):     (NO, None, R.UNKNOWN_WORKSPACE, DISC),
    (None, "snapshot failed"):           (NO, None, R.UNKNOWN_WORKSPACE, _),
    (None, "resume"):                    (NO, None, R.UNKNOWN_WORKSPACE, _),
    (None, "delete"):                    (NO, None, R.UNKNOWN_WORKSPACE, _),
    (None, "destroyed"):                 (NO, None, R.UNKNOWN_WORKSPACE, _),
    (None, "admit"):                        (NO, None, R.UNKNOWN_WORKSPACE, _),
    (None, "expire"):                       (NO, None, R.UNKNOWN_WORKSPACE, _),
    (None, "preempt"):                      (NO, None, R.UNKNOWN_WORKSPACE, _),
    (None, "warn"):                         (NO, None, R.UNKNOWN_WORKSPACE, _),
    (None, "checkpoint"):                   (NO, None, R.UNKNOWN_WORKSPACE, _),
    (None, "server lost"):                  (NO, None, R.UNKNOWN_WORKSPACE, _),
    # -- REQUESTED: a document nothing has acted on yet; only delete moves it -----------------
    (S.REQUESTED, "requested"):             (NO, S.REQUESTED, R.NAME_IN_USE, _),
    (S.REQUESTED, "ready"):                 (NO, S.REQUESTED, R.STALE_READY, _),
    (S.REQUESTED, "provision failed"):      (NO, S.REQUESTED, R.STALE_FAILURE, _),
    (S.REQUESTED, "resume failed"):         (NO, S.REQUESTED, R.STALE_FAILURE, _),
    (S.REQUESTED, "pause"):                 (NO, S.REQUESTED, R.NOT_RUNNING, _),
    (S.REQUESTED, "snapshot ok"):           (NO, S.REQUESTED, R.STALE_SNAPSHOT, DISC),
    (S.REQUESTED, "snapshot ok, other id"): (NO, S.REQUESTED, R.STALE_SNAPSHOT, DISC),
    (S.REQUESTED, "snapshot failed"):       (NO, S.REQUESTED, R.STALE_SNAPSHOT, _),
    (S.REQUESTED, "resume"):                (NO, S.REQUESTED, R.NOT_PAUSED, _),
    (S.REQUESTED, "delete"):                (OK, S.DELETING, R.DELETE_STARTED, DEST),
    (S.REQUESTED, "destroyed"):             (NO, S.REQUESTED, R.STALE_FAILURE, _),
    (S.REQUESTED, "admit"):                 (NO, S.REQUESTED, R.STALE_SCHEDULE, _),
    (S.REQUESTED, "expire"):                (NO, S.REQUESTED, R.STALE_SCHEDULE, _),
    (S.REQUESTED, "preempt"):               (NO, S.REQUESTED, R.STALE_SCHEDULE, _),
    (S.REQUESTED, "warn"):                  (NO, S.REQUESTED, R.STALE_SCHEDULE, _),
    (S.REQUESTED, "checkpoint"):            (NO, S.REQUESTED, R.STALE_SCHEDULE, _),
    (S.REQUESTED, "server lost"):           (NO, S.REQUESTED, R.STALE_PREEMPTION, _),
    # -- QUEUED (a resume waiting, ws-v3 current): start, expire, cancel (pause), delete --
    (S.QUEUED, "requested"):                (NO, S.QUEUED, R.NAME_IN_USE, _),
    (S.QUEUED, "ready"):                    (NO, S.QUEUED, R.STALE_READY, _),
    (S.QUEUED, "provision failed"):         (NO, S.QUEUED, R.STALE_FAILURE, _),
    (S.QUEUED, "resume failed"):            (NO, S.QUEUED, R.STALE_FAILURE, _),
    (S.QUEUED, "pause"):                    (OK, S.PAUSED, R.QUEUE_CANCELLED, _),
    (S.QUEUED, "snapshot ok"):              (NO, S.QUEUED, R.STALE_SNAPSHOT, _),
    (S.QUEUED, "snapshot ok, other id"):    (NO, S.QUEUED, R.STALE_SNAPSHOT, DISC),
    (S.QUEUED, "snapshot failed"):          (NO, S.QUEUED, R.STALE_SNAPSHOT, _),
    (S.QUEUED, "resume"):                   (NO, S.QUEUED, R.ALREADY_QUEUED, _),
    (S.QUEUED, "delete"):                   (OK, S.DELETING, R.DELETE_STARTED, DEST),
    (S.QUEUED, "destroyed"):                (NO, S.QUEUED, R.STALE_FAILURE, _),
    (S.QUEUED, "admit"):                    (OK, S.RESUMING, R.RESUME_STARTED, REST),
    (S.QUEUED, "expire"):                   (OK, S.FAILED, R.QUEUE_EXPIRED, _),
    (S.QUEUED, "preempt"):                  (NO, S.QUEUED, R.STALE_SCHEDULE, _),
    (S.QUEUED, "warn"):                     (NO, S.QUEUED, R.STALE_SCHEDULE, _),
    (S.QUEUED, "checkpoint"):               (NO, S.QUEUED, R.STALE_SCHEDULE, _),
    (S.QUEUED, "server lost"):              (NO, S.QUEUED, R.STALE_PREEMPTION, _),
    # -- PROVISIONING --------------------------------------------------------------------------
    (S.PROVISIONING, "requested"):             (NO, S.PROVISIONING, R.NAME_IN_USE, _),
    (S.PROVISIONING, "ready"):                 (OK, S.RUNNING, R.READY, _),
    (S.PROVISIONING, "provision failed"):      (OK, S.FAILED, R.PROVISION_FAILED, REL),
    (S.PROVISIONING, "resume failed"):         (NO, S.PROVISIONING, R.STALE_FAILURE, _),
    (S.PROVISIONING, "pause"):                 (NO, S.PROVISIONING, R.NOT_RUNNING, _),
    (S.PROVISIONING, "snapshot ok"):           (NO, S.PROVISIONING, R.STALE_SNAPSHOT, DISC),
    (S.PROVISIONING, "snapshot ok, other id"): (NO, S.PROVISIONING, R.STALE_SNAPSHOT, DISC),
    (S.PROVISIONING, "snapshot failed"):       (NO, S.PROVISIONING, R.STALE_SNAPSHOT, _),
    (S.PROVISIONING, "resume"):                (NO, S.PROVISIONING, R.NOT_PAUSED, _),
    (S.PROVISIONING, "delete"):                (OK, S.DELETING, R.DELETE_STARTED, DEST),
    (S.PROVISIONING, "destroyed"):             (NO, S.PROVISIONING, R.STALE_FAILURE, _),
    (S.PROVISIONING, "admit"):              (NO, S.PROVISIONING, R.STALE_SCHEDULE, _),
    (S.PROVISIONING, "expire"):             (NO, S.PROVISIONING, R.STALE_SCHEDULE, _),
    (S.PROVISIONING, "preempt"):            (NO, S.PROVISIONING, R.STALE_SCHEDULE, _),
    (S.PROVISIONING, "warn"):               (NO, S.PROVISIONING, R.STALE_SCHEDULE, _),
    (S.PROVISIONING, "checkpoint"):         (NO, S.PROVISIONING, R.STALE_SCHEDULE, _),
    (S.PROVISIONING, "server lost"):        (OK, S.FAILED, R.PREEMPTED, REL),
    # -- RUNNING -------------------------------------------------------------------------------
    (S.RUNNING, "requested"):             (NO, S.RUNNING, R.NAME_IN_USE, _),
    (S.RUNNING, "ready"):                 (NO, S.RUNNING, R.ALREADY_RUNNING, _),
    (S.RUNNING, "provision failed"):      (NO, S.RUNNING, R.STALE_FAILURE, _),
    (S.RUNNING, "resume failed"):         (NO, S.RUNNING, R.STALE_FAILURE, _),
    (S.RUNNING, "pause"):                 (OK, S.PAUSING, R.PAUSE_STARTED, SNAP),
    # a snapshot that reported after the reconciler gave it up: its objects are orphans
    (S.RUNNING, "snapshot ok"):           (NO, S.RUNNING, R.STALE_SNAPSHOT, DISC),
    (S.RUNNING, "snapshot ok, other id"): (NO, S.RUNNING, R.STALE_SNAPSHOT, DISC),
    (S.RUNNING, "snapshot failed"):       (NO, S.RUNNING, R.STALE_SNAPSHOT, _),
    (S.RUNNING, "resume"):                (NO, S.RUNNING, R.ALREADY_RUNNING, _),
    (S.RUNNING, "delete"):                (OK, S.DELETING, R.DELETE_STARTED, DEST),
    (S.RUNNING, "destroyed"):             (NO, S.RUNNING, R.STALE_FAILURE, _),
    (S.RUNNING, "admit"):                   (NO, S.RUNNING, R.STALE_SCHEDULE, _),
    (S.RUNNING, "expire"):                  (NO, S.RUNNING, R.STALE_SCHEDULE, _),
    (S.RUNNING, "preempt"):                 (OK, S.PAUSING, R.PAUSE_STARTED, SNAP),
    (S.RUNNING, "warn"):                    (OK, S.RUNNING, R.PREEMPTION_WARNING, _),
    (S.RUNNING, "checkpoint"):              (OK, S.RUNNING, R.CHECKPOINT_STARTED, SNAP),
    (S.RUNNING, "server lost"):             (OK, S.FAILED, R.PREEMPTED, REL),
    # -- PAUSING (ws-v3 pending) ---------------------------------------------------------------
    (S.PAUSING, "requested"):             (NO, S.PAUSING, R.NAME_IN_USE, _),
    (S.PAUSING, "ready"):                 (NO, S.PAUSING, R.STALE_READY, _),
    (S.PAUSING, "provision failed"):      (NO, S.PAUSING, R.STALE_FAILURE, _),
    (S.PAUSING, "resume failed"):         (NO, S.PAUSING, R.STALE_FAILURE, _),
    (S.PAUSING, "pause"):                 (NO, S.PAUSING, R.ALREADY_PAUSING, _),
    (S.PAUSING, "snapshot ok"):           (OK, S.PAUSED, R.PAUSED, REL),
    (S.PAUSING, "snapshot ok, other id"): (NO, S.PAUSING, R.STALE_SNAPSHOT, DISC),
    (S.PAUSING, "snapshot failed"):       (OK, S.RUNNING, R.SNAPSHOT_FAILED, DISC),
    (S.PAUSING, "resume"):                (NO, S.PAUSING, R.NOT_PAUSED, _),
    (S.PAUSING, "delete"):                (OK, S.DELETING, R.DELETE_STARTED, DEST),
    (S.PAUSING, "destroyed"):             (NO, S.PAUSING, R.STALE_FAILURE, _),
    (S.PAUSING, "admit"):                   (NO, S.PAUSING, R.STALE_SCHEDULE, _),
    (S.PAUSING, "expire"):                  (NO, S.PAUSING, R.STALE_SCHEDULE, _),
    (S.PAUSING, "preempt"):                 (NO, S.PAUSING, R.STALE_SCHEDULE, _),
    (S.PAUSING, "warn"):                    (NO, S.PAUSING, R.STALE_SCHEDULE, _),
    (S.PAUSING, "checkpoint"):              (NO, S.PAUSING, R.STALE_SCHEDULE, _),
    (S.PAUSING, "server lost"):             (NO, S.PAUSING, R.PREEMPTED_WHILE_PAUSING, _),
    # -- PAUSED (ws-v3 current): a redelivered ws-v3 is not discarded, it is the snapshot ------
    (S.PAUSED, "requested"):             (NO, S.PAUSED, R.NAME_IN_USE, _),
    (S.PAUSED, "ready"):                 (NO, S.PAUSED, R.STALE_READY, _),
    (S.PAUSED, "provision failed"):      (NO, S.PAUSED, R.STALE_FAILURE, _),
    (S.PAUSED, "resume failed"):         (NO, S.PAUSED, R.STALE_FAILURE, _),
    (S.PAUSED, "pause"):                 (NO, S.PAUSED, R.ALREADY_PAUSED, _),
    (S.PAUSED, "snapshot ok"):           (NO, S.PAUSED, R.STALE_SNAPSHOT, _),
    (S.PAUSED, "snapshot ok, other id"): (NO, S.PAUSED, R.STALE_SNAPSHOT, DISC),
    (S.PAUSED, "snapshot failed"):       (NO, S.PAUSED, R.STALE_SNAPSHOT, _),
    (S.PAUSED, "resume"):                (OK, S.RESUMING, R.RESUME_STARTED, REST),
    (S.PAUSED, "delete"):                (OK, S.DELETING, R.DELETE_STARTED, DEST),
    (S.PAUSED, "destroyed"):             (NO, S.PAUSED, R.STALE_FAILURE, _),
    (S.PAUSED, "admit"):                    (NO, S.PAUSED, R.STALE_SCHEDULE, _),
    (S.PAUSED, "expire"):                   (NO, S.PAUSED, R.STALE_SCHEDULE, _),
    (S.PAUSED, "preempt"):                  (NO, S.PAUSED, R.STALE_SCHEDULE, _),
    (S.PAUSED, "warn"):                     (NO, S.PAUSED, R.STALE_SCHEDULE, _),
    (S.PAUSED, "checkpoint"):               (NO, S.PAUSED, R.STALE_SCHEDULE, _),
    (S.PAUSED, "server lost"):              (NO, S.PAUSED, R.STALE_PREEMPTION, _),
    # -- RESUMING (from ws-v3) -----------------------------------------------------------------
    (S.RESUMING, "requested"):             (NO, S.RESUMING, R.NAME_IN_USE, _),
    (S.RESUMING, "ready"):                 (OK, S.RUNNING, R.RESUMED, _),
    (S.RESUMING, "provision failed"):      (NO, S.RESUMING, R.STALE_FAILURE, _),
    (S.RESUMING, "resume failed"):         (OK, S.FAILED, R.RESUME_FAILED, REL),
    (S.RESUMING, "pause"):                 (NO, S.RESUMING, R.NOT_RUNNING, _),
    (S.RESUMING, "snapshot ok"):           (NO, S.RESUMING, R.STALE_SNAPSHOT, _),
    (S.RESUMING, "snapshot ok, other id"): (NO, S.RESUMING, R.STALE_SNAPSHOT, DISC),
    (S.RESUMING, "snapshot failed"):       (NO, S.RESUMING, R.STALE_SNAPSHOT, _),
    (S.RESUMING, "resume"):                (NO, S.RESUMING, R.ALREADY_RESUMING, _),
    (S.RESUMING, "delete"):                (OK, S.DELETING, R.DELETE_STARTED, DEST),
    (S.RESUMING, "destroyed"):             (NO, S.RESUMING, R.STALE_FAILURE, _),
    (S.RESUMING, "admit"):                  (NO, S.RESUMING, R.STALE_SCHEDULE, _),
    (S.RESUMING, "expire"):                 (NO, S.RESUMING, R.STALE_SCHEDULE, _),
    (S.RESUMING, "preempt"):                (NO, S.RESUMING, R.STALE_SCHEDULE, _),
    (S.RESUMING, "warn"):                   (NO, S.RESUMING, R.STALE_SCHEDULE, _),
    (S.RESUMING, "checkpoint"):             (NO, S.RESUMING, R.STALE_SCHEDULE, _),
    (S.RESUMING, "server lost"):            (OK, S.PAUSED, R.RECOVERED, REL),
    # -- DELETING (deleted while ws-v3 was pending): a late snapshot is discarded -------------
    (S.DELETING, "requested"):             (NO, S.DELETING, R.NAME_IN_USE, _),
    (S.DELETING, "ready"):                 (NO, S.DELETING, R.STALE_READY, _),
    (S.DELETING, "provision failed"):      (NO, S.DELETING, R.STALE_FAILURE, _),
    (S.DELETING, "resume failed"):         (NO, S.DELETING, R.STALE_FAILURE, _),
    (S.DELETING, "pause"):                 (NO, S.DELETING, R.NOT_RUNNING, _),
    (S.DELETING, "snapshot ok"):           (NO, S.DELETING, R.STALE_SNAPSHOT, DISC),
    (S.DELETING, "snapshot ok, other id"): (NO, S.DELETING, R.STALE_SNAPSHOT, DISC),
    (S.DELETING, "snapshot failed"):       (NO, S.DELETING, R.STALE_SNAPSHOT, _),
    (S.DELETING, "resume"):                (NO, S.DELETING, R.NOT_PAUSED, _),
    (S.DELETING, "delete"):                (OK, S.DELETING, R.DELETE_RETRIED, DEST),
    (S.DELETING, "destroyed"):             (OK, S.DELETED, R.DELETED, _),
    (S.DELETING, "admit"):                  (NO, S.DELETING, R.STALE_SCHEDULE, _),
    (S.DELETING, "expire"):                 (NO, S.DELETING, R.STALE_SCHEDULE, _),
    (S.DELETING, "preempt"):                (NO, S.DELETING, R.STALE_SCHEDULE, _),
    (S.DELETING, "warn"):                   (NO, S.DELETING, R.STALE_SCHEDULE, _),
    (S.DELETING, "checkpoint"):             (NO, S.DELETING, R.STALE_SCHEDULE, _),
    (S.DELETING, "server lost"):            (NO, S.DELETING, R.STALE_PREEMPTION, _),
    # -- DELETED: the name is free again; everything else is about a workspace that is gone --
    (S.DELETED, "requested"):             (OK, S.PROVISIONING, R.CREATED, PROV),
    (S.DELETED, "ready"):                 (NO, S.DELETED, R.UNKNOWN_WORKSPACE, _),
    (S.DELETED, "provision failed"):      (NO, S.DELETED, R.UNKNOWN_WORKSPACE, _),
    (S.DELETED, "resume failed"):         (NO, S.DELETED, R.UNKNOWN_WORKSPACE, _),
    (S.DELETED, "pause"):                 (NO, S.DELETED, R.UNKNOWN_WORKSPACE, _),
    (S.DELETED, "snapshot ok"):           (NO, S.DELETED, R.UNKNOWN_WORKSPACE, DISC),
    (S.DELETED, "snapshot ok, other id"): (NO, S.DELETED, R.UNKNOWN_WORKSPACE, DISC),
    (S.DELETED, "snapshot failed"):       (NO, S.DELETED, R.UNKNOWN_WORKSPACE, _),
    (S.DELETED, "resume"):                (NO, S.DELETED, R.UNKNOWN_WORKSPACE, _),
    (S.DELETED, "delete"):                (NO, S.DELETED, R.ALREADY_DELETED, _),
    (S.DELETED, "destroyed"):             (NO, S.DELETED, R.UNKNOWN_WORKSPACE, _),
    (S.DELETED, "admit"):                   (NO, S.DELETED, R.UNKNOWN_WORKSPACE, _),
    (S.DELETED, "expire"):                  (NO, S.DELETED, R.UNKNOWN_WORKSPACE, _),
    (S.DELETED, "preempt"):                 (NO, S.DELETED, R.UNKNOWN_WORKSPACE, _),
    (S.DELETED, "warn"):                    (NO, S.DELETED, R.UNKNOWN_WORKSPACE, _),
    (S.DELETED, "checkpoint"):              (NO, S.DELETED, R.UNKNOWN_WORKSPACE, _),
    (S.DELETED, "server lost"):             (NO, S.DELETED, R.UNKNOWN_WORKSPACE, _),
    # -- FAILED by a resume, keeping ws-v3: resume again or delete; the name stays taken ------
    (S.FAILED, "requested"):             (NO, S.FAILED, R.NAME_IN_USE, _),
    (S.FAILED, "ready"):                 (NO, S.FAILED, R.STALE_READY, _),
    (S.FAILED, "provision failed"):      (NO, S.FAILED, R.STALE_FAILURE, _),
    (S.FAILED, "resume failed"):         (NO, S.FAILED, R.STALE_FAILURE, _),
    (S.FAILED, "pause"):                 (NO, S.FAILED, R.NOT_RUNNING, _),
    (S.FAILED, "snapshot ok"):           (NO, S.FAILED, R.STALE_SNAPSHOT, _),
    (S.FAILED, "snapshot ok, other id"): (NO, S.FAILED, R.STALE_SNAPSHOT, DISC),
    (S.FAILED, "snapshot failed"):       (NO, S.FAILED, R.STALE_SNAPSHOT, _),
    (S.FAILED, "resume"):                (OK, S.RESUMING, R.RESUME_STARTED, REST),
    (S.FAILED, "delete"):                (OK, S.DELETING, R.DELETE_STARTED, DEST),
    (S.FAILED, "destroyed"):             (NO, S.FAILED, R.STALE_FAILURE, _),
    (S.FAILED, "admit"):                    (NO, S.FAILED, R.STALE_SCHEDULE, _),
    (S.FAILED, "expire"):                   (NO, S.FAILED, R.STALE_SCHEDULE, _),
    (S.FAILED, "preempt"):                  (NO, S.FAILED, R.STALE_SCHEDULE, _),
    (S.FAILED, "warn"):                     (NO, S.FAILED, R.STALE_SCHEDULE, _),
    (S.FAILED, "checkpoint"):               (NO, S.FAILED, R.STALE_SCHEDULE, _),
    (S.FAILED, "server lost"):              (NO, S.FAILED, R.STALE_PREEMPTION, _),
    # -- a lost node takes the server of what runs or starts on it: PAUSED from its snapshot --
    (None, "node lost"):               (NO, None, R.UNKNOWN_WORKSPACE, _),
    (S.REQUESTED, "node lost"):        (NO, S.REQUESTED, R.STALE_PREEMPTION, _),
    (S.PROVISIONING, "node lost"):     (OK, S.FAILED, R.PREEMPTED, REL),
    (S.RUNNING, "node lost"):          (OK, S.FAILED, R.PREEMPTED, REL),
    # the snapshot's own outcome decides (GKE may still complete a Pod Snapshot it began)
    (S.PAUSING, "node lost"):          (NO, S.PAUSING, R.PREEMPTED_WHILE_PAUSING, _),
    (S.PAUSED, "node lost"):           (NO, S.PAUSED, R.STALE_PREEMPTION, _),
    (S.RESUMING, "node lost"):         (OK, S.PAUSED, R.RECOVERED, REL),
    (S.QUEUED, "node lost"):           (NO, S.QUEUED, R.STALE_PREEMPTION, _),
    (S.DELETING, "node lost"):         (NO, S.DELETING, R.STALE_PREEMPTION, _),
    (S.DELETED, "node lost"):          (NO, S.DELETED, R.UNKNOWN_WORKSPACE, _),
    (S.FAILED, "node lost"):           (NO, S.FAILED, R.STALE_PREEMPTION, _),
    # -- a runtime alert is noted on a RUNNING workspace, with no transition -------------------
    (None, "runtime alert"):           (NO, None, R.UNKNOWN_WORKSPACE, _),
    (S.REQUESTED, "runtime alert"):    (NO, S.REQUESTED, R.STALE_ALERT, _),
    (S.PROVISIONING, "runtime alert"): (NO, S.PROVISIONING, R.STALE_ALERT, _),
    (S.QUEUED, "runtime alert"):       (NO, S.QUEUED, R.STALE_ALERT, _),
    (S.RUNNING, "runtime alert"):      (OK, S.RUNNING, R.RUNTIME_ALERT, _),
    (S.PAUSING, "runtime alert"):      (NO, S.PAUSING, R.STALE_ALERT, _),
    (S.PAUSED, "runtime alert"):       (NO, S.PAUSED, R.STALE_ALERT, _),
    (S.RESUMING, "runtime alert"):     (NO, S.RESUMING, R.STALE_ALERT, _),
    (S.DELETING, "runtime alert"):     (NO, S.DELETING, R.STALE_ALERT, _),
    (S.DELETED, "runtime alert"):      (NO, S.DELETED, R.UNKNOWN_WORKSPACE, _),
    (S.FAILED, "runtime alert"):       (NO, S.FAILED, R.STALE_ALERT, _),
}


def _ws(state: State, **changes: Any) -> Workspace:
    doc = DOCS[state]
    assert doc is not None
    return dataclasses.replace(doc, **changes)


# -- the table -----------------------------------------------------------------------------


def test_the_table_covers_every_state_and_every_signal() -> None:
    every = set(itertools.product([None, *State], SIGNALS))
    assert set(TABLE) == every
    assert set(DOCS) == {None, *State}
    for state, doc in DOCS.items():
        assert (doc.state if doc else None) == state


def test_the_signals_cover_every_signal_type() -> None:
    signal_types = {type(s) for s in SIGNALS.values()}
    assert signal_types == {WorkspaceRequested, WorkspaceReady, WorkspaceRuntimeFailed,
                            WorkspacePauseRequested, SnapshotFinished, WorkspaceResumeRequested,
                            WorkspaceDeleteRequested, WorkspaceScheduled, WorkspacePreempted,
                            WorkspaceRuntimeAlert, RuntimeDestroyed}


def test_the_canonical_documents_follow_the_snapshot_naming() -> None:
    assert snapshot_id_for(_ws(State.RUNNING)) == MATCHING


@pytest.mark.parametrize(("state", "signal"), list(TABLE),
                         ids=[f"{s or 'none'}-{e}" for s, e in TABLE])
def test_transition(state: State | None, signal: str) -> None:
    accepted, new_state, reason, command_types = TABLE[(state, signal)]
    ws = DOCS[state]
    decision = decide(ws, SIGNALS[signal], NOW)
    after = decision.workspace.state if decision.workspace else None
    got = (decision.accepted, after, decision.reason, tuple(type(c) for c in decision.commands))
    assert got == (accepted, new_state, reason, command_types)
    assert decision.previous_state == state
    for command in decision.commands:
        assert command.workspace_id == WS
    if not decision.accepted:
        # A refusal changes nothing, and says why.
        assert decision.workspace is ws
        assert decision.message
        assert not decision.changed_state
    elif decision.workspace is not ws and reason != R.RUNTIME_ALERT:  # a note, see below
        assert decision.workspace is not None
        assert decision.workspace.version == (ws.version if ws else 0) + 1
        if reason in NOTES:
            # A note keeps the state, its reason and the moment it was entered.
            assert ws is not None
            assert decision.workspace.state_reason == ws.state_reason
            assert decision.workspace.updated_at == ws.updated_at
        else:
            assert decision.workspace.state_reason == str(reason)
            assert decision.workspace.updated_at == NOW
        assert decision.changed_state == (new_state != state)


@pytest.mark.parametrize(("state", "signal"), list(TABLE),
                         ids=[f"{s or 'none'}-{e}" for s, e in TABLE])
def test_decide_is_pure(state: State | None, signal: str) -> None:
    """Same inputs, same decision; the input document is never mutated (it is frozen)."""
    ws = DOCS[state]
    before = dataclasses.replace(ws) if ws else None
    assert decide(ws, SIGNALS[signal], NOW) == decide(ws, SIGNALS[signal], NOW)
    assert ws == before


# -- refusals and versions -----------------------------------------------------------------


def test_a_refusal_returns_the_same_workspace_object() -> None:
    paused = _ws(State.PAUSED)
    decision = decide(paused, WorkspacePauseRequested(WS, "bob"), NOW)
    assert not decision.accepted
    assert decision.workspace is paused
    assert decision.workspace == DOCS[State.PAUSED]
    assert decision.commands == ()
    assert decision.message == "already paused"


def test_version_counts_every_accepted_transition() -> None:
    ws: Workspace | None = None
    signals = [SIGNALS[k] for k in ("requested", "ready", "pause", "snapshot ok", "resume",
                                    "ready", "pause")]
    for expected, signal in enumerate(signals, start=1):
        decision = decide(ws, signal, NOW)
        assert decision.accepted, decision
        assert decision.workspace is not None
        assert decision.workspace.version == expected
        ws = decision.workspace
    # The second pause names the next snapshot.
    assert ws is not None and ws.state == State.PAUSING
    assert ws.pending_snapshot == "ml-a--ws-v7"


def test_a_retried_delete_keeps_the_version_and_reissues_destroy() -> None:
    deleting = _ws(State.DELETING, keep_home=True)
    decision = decide(deleting, WorkspaceDeleteRequested(WS, "alice", keep_home=True), NOW)
    assert decision.accepted and decision.reason == Reason.DELETE_RETRIED
    assert decision.workspace is deleting
    assert not decision.changed_state
    assert decision.commands == (Destroy(WS, keep_home=True),)


def test_delete_keeps_home_when_asked() -> None:
    decision = decide(_ws(State.PAUSED), WorkspaceDeleteRequested(WS, "alice", True), NOW)
    assert decision.workspace is not None and decision.workspace.keep_home
    assert decision.commands == (Destroy(WS, keep_home=True),)
    assert decision.workspace.transition_started_at == NOW


# -- timings from the injected clock -------------------------------------------------------


def test_timings_come_from_now() -> None:
    t = T0
    created = decide(None, SIGNALS["requested"], t)
    assert created.workspace is not None
    assert (created.workspace.created_at, created.workspace.transition_started_at) == (t, t)
    running = decide(created.workspace, SIGNALS["ready"], t + timedelta(seconds=1.5))
    assert running.workspace is not None
    assert running.workspace.first_start_ms == 1500
    assert running.workspace.last_activity == t + timedelta(seconds=1.5)
    assert running.workspace.transition_started_at is None
    assert running.workspace.url == "http://ws-new"

    t = T0 + timedelta(hours=1)
    pausing = decide(running.workspace, WorkspacePauseRequested(WS, "alice"), t)
    assert pausing.workspace is not None and pausing.workspace.transition_started_at == t
    snapshot_id = pausing.workspace.pending_snapshot
    assert snapshot_id is not None
    paused = decide(pausing.workspace, SnapshotFinished(WS, snapshot_id, True),
                    t + timedelta(milliseconds=2250))
    assert paused.workspace is not None
    assert paused.workspace.last_pause_ms == 2250
    assert paused.workspace.first_start_ms == 1500
    assert paused.workspace.url is None

    t = T0 + timedelta(days=2)
    resuming = decide(paused.workspace, WorkspaceResumeRequested(WS, "alice"), t)
    assert resuming.workspace is not None
    resumed = decide(resuming.workspace, SIGNALS["ready"], t + timedelta(milliseconds=750))
    assert resumed.workspace is not None
    assert resumed.workspace.last_resume_ms == 750
    assert (resumed.workspace.first_start_ms, resumed.workspace.last_pause_ms) == (1500, 2250)
    assert resumed.workspace.updated_at == t + timedelta(milliseconds=750)
    assert resumed.workspace.created_at == T0


def test_a_clock_that_went_backwards_gives_zero_not_negative() -> None:
    provisioning = _ws(State.PROVISIONING, transition_started_at=NOW)
    decision = decide(provisioning, SIGNALS["ready"], NOW - timedelta(seconds=3))
    assert decision.workspace is not None and decision.workspace.first_start_ms == 0


def test_no_start_time_no_timing() -> None:
    provisioning = _ws(State.PROVISIONING, transition_started_at=None)
    decision = decide(provisioning, SIGNALS["ready"], NOW)
    assert decision.workspace is not None and decision.workspace.first_start_ms is None


# -- pausing and snapshots -----------------------------------------------------------------


def test_snapshot_id_is_deterministic() -> None:
    running = _ws(State.RUNNING)
    first = decide(running, WorkspacePauseRequested(WS, "alice"), NOW)
    retry = decide(running, WorkspacePauseRequested(WS, "idle-policy", "idle"),
                   NOW + timedelta(minutes=5))
    assert first.commands == retry.commands == (Snapshot(WS, MATCHING),)
    assert first.workspace is not None and first.workspace.pending_snapshot == MATCHING
    assert snapshot_id_for(running) == snapshot_id_for(dataclasses.replace(running)) == MATCHING


def test_a_pause_after_a_failed_pause_names_a_new_snapshot() -> None:
    failed = decide(_ws(State.PAUSING), SIGNALS["snapshot failed"], NOW)
    assert failed.workspace is not None and failed.workspace.state == State.RUNNING
    again = decide(failed.workspace, WorkspacePauseRequested(WS, "alice"), NOW)
    assert again.workspace is not None
    assert again.workspace.pending_snapshot not in (None, MATCHING)


@pytest.mark.parametrize("name", ["ws", "n" * 40, "a" + "-b" * 39])
@pytest.mark.parametrize("team", ["ml-a", "t" * 40, "c" + "-d" * 39])
@pytest.mark.parametrize("version", [0, 9, 12345])
def test_snapshot_ids_fit_the_contract(team: str, name: str, version: int) -> None:
    """Every id a pause names can travel in snapshot.finished, however long the names."""
    ws = Workspace(id=f"{team}--{name}", team=team, owner="o", name=name, profile="p",
                   state=State.RUNNING, version=version)
    snapshot_id = snapshot_id_for(ws)
    assert snapshot_id.endswith(f"-v{version + 1}")
    event = new_event(SnapshotFinished(ws.id, snapshot_id, True))
    assert event.payload.snapshot_id == snapshot_id
    if len(ws.id) <= 75:
        assert snapshot_id == f"{ws.id}-v{version + 1}"


def test_long_snapshot_ids_stay_distinct() -> None:
    names = ["x" * 39 + "a", "x" * 39 + "b"]
    ids = {snapshot_id_for(Workspace(id=f"{'t' * 40}--{n}", team="t" * 40, owner="o", name=n,
                                     profile="p", version=3)) for n in names}
    assert len(ids) == 2


def test_pause_records_its_cause() -> None:
    decision = decide(_ws(State.RUNNING), WorkspacePauseRequested(WS, "policy", "idle"), NOW)
    assert decision.workspace is not None and decision.workspace.pause_cause == "idle"


def test_a_successful_snapshot_becomes_current() -> None:
    decision = decide(_ws(State.PAUSING), SIGNALS["snapshot ok"], NOW)
    assert decision.workspace is not None
    assert (decision.workspace.current_snapshot, decision.workspace.pending_snapshot) == (
        MATCHING, None)
    assert decision.commands == (Release(WS),)


def test_a_failed_snapshot_keeps_running_with_the_reason() -> None:
    pausing = _ws(State.PAUSING, current_snapshot=OTHER)
    decision = decide(pausing, SIGNALS["snapshot failed"], NOW)
    assert decision.workspace is not None
    assert decision.workspace.state == State.RUNNING
    assert decision.workspace.state_message == decision.message == "kernel died"
    assert decision.workspace.pending_snapshot is None
    assert decision.workspace.current_snapshot == OTHER  # the older snapshot is kept
    assert decision.commands == (DiscardSnapshot(WS, MATCHING),)


def test_a_failed_snapshot_without_error_says_so() -> None:
    decision = decide(_ws(State.PAUSING), SnapshotFinished(WS, MATCHING, False), NOW)
    assert decision.message == "the snapshot failed"


def test_snapshot_finished_while_deleting_is_discarded() -> None:
    deleting = _ws(State.DELETING)
    decision = decide(deleting, SIGNALS["snapshot ok"], NOW)
    assert (decision.accepted, decision.reason) == (False, Reason.STALE_SNAPSHOT)
    assert decision.commands == (DiscardSnapshot(WS, MATCHING),)
    assert decision.workspace is deleting
    assert "DELETING" in decision.message


def test_a_redelivered_snapshot_is_not_discarded() -> None:
    paused = _ws(State.PAUSED)
    decision = decide(paused, SIGNALS["snapshot ok"], NOW)
    assert (decision.accepted, decision.commands) == (False, ())


# -- resuming ------------------------------------------------------------------------------


def test_duplicate_resume_is_refused() -> None:
    resuming = decide(_ws(State.PAUSED), SIGNALS["resume"], NOW).workspace
    assert resuming is not None and resuming.state == State.RESUMING
    duplicate = decide(resuming, SIGNALS["resume"], NOW + timedelta(seconds=1))
    assert (duplicate.accepted, duplicate.reason) == (False, Reason.ALREADY_RESUMING)
    assert duplicate.workspace is resuming
    assert duplicate.commands == ()


def test_resume_restores_the_current_snapshot_on_another_profile() -> None:
    decision = decide(_ws(State.PAUSED), WorkspaceResumeRequested(WS, "alice", "cpu-large"),
                      NOW)
    assert decision.commands == (Restore(WS, MATCHING),)
    assert decision.workspace is not None and decision.workspace.profile == "cpu-large"
    same = decide(_ws(State.PAUSED), WorkspaceResumeRequested(WS, "alice"), NOW)
    assert same.workspace is not None and same.workspace.profile == "gpu-small"


def test_a_failed_resume_keeps_its_snapshot_for_a_retry() -> None:
    failed = decide(_ws(State.RESUMING), SIGNALS["resume failed"], NOW)
    assert failed.workspace is not None
    assert failed.workspace.current_snapshot == MATCHING
    assert failed.workspace.state_message == "no node with nvidia-l4"
    retry = decide(failed.workspace, SIGNALS["resume"], NOW)
    assert retry.accepted and retry.commands == (Restore(WS, MATCHING),)


ANCHOR = "5e" * 32


def test_the_manifest_hash_anchors_every_restore_and_bases_the_next_snapshot() -> None:
    pausing = _ws(State.PAUSING)
    finished = SnapshotFinished(WS, MATCHING, True, bytes=10, manifest_sha256=ANCHOR)
    paused = decide(pausing, finished, NOW).workspace
    assert paused is not None and paused.current_manifest_sha256 == ANCHOR

    resume = decide(paused, WorkspaceResumeRequested(WS, "alice", device_arrays_to_cpu=True), NOW)
    assert resume.commands == (Restore(WS, MATCHING, ANCHOR, device_arrays_to_cpu=True),)
    running = dataclasses.replace(paused, state=State.RUNNING)
    pause = decide(running, SIGNALS["pause"], NOW)
    snapshot_id = snapshot_id_for(running)
    assert pause.commands == (Snapshot(WS, snapshot_id, base=MATCHING,
                                       base_manifest_sha256=ANCHOR),)


@pytest.mark.parametrize(("cause", "reason"), [
    ("snapshot_integrity", Reason.SNAPSHOT_INTEGRITY),
    ("restore_refused", Reason.RESTORE_REFUSED),
    # the node agent restarted during the restore (found by the chaos harness: FAILED)
    ("interrupted", Reason.RESUME_INTERRUPTED),
])
def test_a_resume_refused_with_the_snapshot_intact_leaves_the_workspace_paused(
    cause: str, reason: Reason,
) -> None:
    resuming = _ws(State.RESUMING, current_manifest_sha256=ANCHOR)
    why = "gs://b/snapshots/ml-a/ml-a--ws/ml-a--ws-v3/manifest.json has sha256 9f...: changed"
    decision = decide(resuming, WorkspaceRuntimeFailed(WS, "resume", why, cause=cause), NOW)

    assert (decision.accepted, decision.reason) == (True, reason)
    ws = decision.workspace
    assert ws is not None and ws.state == State.PAUSED and ws.state_message == why
    assert (ws.current_snapshot, ws.current_manifest_sha256) == (MATCHING, ANCHOR)
    assert decision.commands == (Release(WS),)
    assert decide(ws, SIGNALS["resume"], NOW).accepted  # it can be resumed again


def test_resume_without_a_snapshot_is_refused() -> None:
    provision_failed = _ws(State.FAILED, current_snapshot=None, state_reason="provision_failed")
    decision = decide(provision_failed, SIGNALS["resume"], NOW)
    assert (decision.accepted, decision.reason) == (False, Reason.NO_SNAPSHOT)


# -- creating, re-creating -----------------------------------------------------------------


def test_create_takes_everything_from_the_request() -> None:
    request = WorkspaceRequested("ml-b", "carol", "exp-1", "cpu-small", ide="vscode",
                                 environment="python-3-10", reply_to="slack:C9")
    decision = decide(None, request, NOW)
    ws = decision.workspace
    assert ws is not None
    assert (ws.id, ws.team, ws.owner, ws.name, ws.profile, ws.ide, ws.environment,
            ws.reply_to) == ("ml-b--exp-1", "ml-b", "carol", "exp-1", "cpu-small", "vscode",
                             "python-3-10", "slack:C9")
    assert (ws.state, ws.version, ws.created_at) == (State.PROVISIONING, 1, NOW)
    assert decision.commands == (Provision("ml-b--exp-1"),)
    assert decision.previous_state is None and decision.changed_state


def test_a_deleted_name_can_be_requested_again() -> None:
    deleted = _ws(State.DELETED, current_snapshot="ml-a--ws-v2", url="http://old")
    request = WorkspaceRequested("ml-a", "bob", "ws", "cpu-small", reply_to="slack:C2")
    decision = decide(deleted, request, NOW)
    ws = decision.workspace
    assert ws is not None and decision.accepted
    assert (ws.state, ws.owner, ws.profile, ws.reply_to) == (
        State.PROVISIONING, "bob", "cpu-small", "slack:C2")
    # A new workspace: nothing of the old one but the version, which keeps counting so that
    # snapshot ids and state_changed event ids are never reused.
    assert ws.version == deleted.version + 1
    assert (ws.current_snapshot, ws.url, ws.first_start_ms) == (None, None, None)
    assert decision.previous_state == State.DELETED


def test_a_failed_workspace_with_a_snapshot_refuses_re_creation() -> None:
    decision = decide(_ws(State.FAILED), SIGNALS["requested"], NOW)
    assert (decision.accepted, decision.reason) == (False, Reason.NAME_IN_USE)
    assert MATCHING in decision.message
    assert "resume it or delete it" in decision.message


def test_a_failed_workspace_without_a_snapshot_can_be_re_created() -> None:
    failed = _ws(State.FAILED, current_snapshot=None, state_reason="provision_failed")
    decision = decide(failed, SIGNALS["requested"], NOW)
    assert decision.accepted and decision.workspace is not None
    assert decision.workspace.state == State.PROVISIONING
    assert decision.workspace.version == failed.version + 1


def test_a_live_name_is_refused_with_its_state() -> None:
    decision = decide(_ws(State.RUNNING), SIGNALS["requested"], NOW)
    assert decision.message == "workspace ws already exists (RUNNING); pick another name"


def test_refuse_admission_records_failed_with_the_message() -> None:
    request = SIGNALS["requested"]
    decision = refuse_admission(None, request, "team ml-a uses 4/4 GPUs", NOW)
    ws = decision.workspace
    assert isinstance(decision, Decision) and decision.accepted
    assert decision.reason == Reason.ADMISSION_REFUSED
    assert decision.message == "team ml-a uses 4/4 GPUs"
    assert ws is not None
    assert (ws.state, ws.state_reason, ws.state_message) == (
        State.FAILED, "admission_refused", "team ml-a uses 4/4 GPUs")
    assert (ws.version, ws.owner, ws.reply_to, ws.created_at) == (1, "alice", "slack:C1", NOW)
    assert decision.commands == ()
    assert decision.previous_state is None and decision.changed_state
    assert ws.state not in HOLDS_SLOT and ws.state not in HOLDS_HARDWARE


@pytest.mark.parametrize("state", [State.DELETED, State.FAILED])
def test_refuse_admission_over_an_old_document_is_about_the_new_request(state: State) -> None:
    """The refusal goes to whoever asked, and leaves no stale snapshot that would later
    refuse re-creation ("failed but keeps snapshot ...")."""
    old = _ws(state, current_snapshot="ml-a--ws-v2" if state == State.DELETED else None,
              owner="alice", reply_to="slack:old", profile="gpu-small")
    request = WorkspaceRequested("ml-a", "bob", "ws", "cpu-small", reply_to="slack:new")
    decision = refuse_admission(old, request, "no", NOW)
    ws = decision.workspace
    assert ws is not None
    assert (ws.owner, ws.profile, ws.reply_to, ws.current_snapshot) == (
        "bob", "cpu-small", "slack:new", None)
    assert ws.version == old.version + 1
    assert decision.previous_state == state
    again = decide(ws, request, NOW)
    assert again.accepted and again.reason == Reason.CREATED


# -- the state sets ------------------------------------------------------------------------


def test_state_sets() -> None:
    assert frozenset({State.PROVISIONING, State.RUNNING, State.PAUSING,
                      State.RESUMING}) == HOLDS_HARDWARE
    assert HOLDS_HARDWARE < HOLDS_SLOT
    assert set(State) - HOLDS_SLOT == {State.DELETED, State.FAILED}
    assert frozenset({State.PROVISIONING, State.PAUSING, State.RESUMING,
                      State.DELETING}) == IN_TRANSITION


def test_reasons_are_strings_and_states_serialize() -> None:
    assert str(Reason.STALE_SNAPSHOT) == "stale_snapshot"
    assert str(State.PAUSED) == "PAUSED"
    assert len({r.value for r in Reason}) == len(Reason)


def test_invalid_signals_cannot_be_built_into_events() -> None:
    """The runtime_failed operations the lifecycle reads are ones the contract allows."""
    for operation in ("provision", "resume"):
        new_event(WorkspaceRuntimeFailed(WS, operation, "x"))
    with pytest.raises(InvalidEvent):
        new_event(WorkspaceRuntimeFailed(WS, "explode", "x"))


# -- what a decision tells: workspace.state_changed --------------------------------------------


def test_a_state_change_is_told_once_per_version_and_a_refusal_or_retry_tells_nothing() -> None:
    decision = decide(_ws(State.RUNNING), WorkspacePauseRequested(WS, "bob", cause="idle",
                                                                  detail="idle 2 h"), NOW)
    [change] = decision.events
    assert (change.from_state, change.to_state, change.reason, change.message) == (
        "RUNNING", "PAUSING", "pause_started", "idle 2 h")
    assert change.event_id == f"{WS}-v{decision.workspace.version}"  # type: ignore[union-attr]
    assert decision.outcome() == {"accepted": True, "reason": "pause_started",
                                  "message": "idle 2 h", "state": "PAUSING"}
    refused = decide(_ws(State.PAUSED), WorkspacePauseRequested(WS, "bob"), NOW)
    assert refused.events == () and refused.outcome()["state"] == "PAUSED"
    retried = decide(_ws(State.DELETING), WorkspaceDeleteRequested(WS, "bob"), NOW)
    assert retried.accepted and retried.events == ()  # DELETING again: no change to tell


# -- cluster monitoring: a lost node, a runtime alert ---------------------------------------


def test_a_lost_node_pauses_the_server_it_ran_from_its_snapshot_saying_what_was_lost(
) -> None:
    running = _ws(State.RUNNING, updated_at=T0, current_snapshot=OTHER)
    decision = decide(running, SIGNALS["node lost"], NOW)
    assert decision.workspace is not None and decision.workspace.state == State.PAUSED
    assert decision.reason == Reason.RECOVERED and decision.commands == (Release(WS),)
    assert decision.workspace.current_snapshot == OTHER
    assert decision.workspace.url is None and decision.workspace.state not in HOLDS_HARDWARE
    # It ran from 09:00 (the snapshot it resumed from) until the node went at 11:00.
    assert decision.workspace.lost_work_seconds == 7200
    assert decision.message == (
        "node gke-pool-spot-1 was preempted (Spot) at 11:00:00: paused from the snapshot it "
        f"resumed from ({OTHER}); 2h 0m of work since then is lost. Resume with "
        "`stasis ws resume ws --team ml-a`")
    resumed = decide(decision.workspace, SIGNALS["resume"], NOW)
    assert resumed.accepted and resumed.commands == (Restore(WS, OTHER),)


def test_a_lost_node_without_a_snapshot_says_there_is_nothing_to_resume() -> None:
    lost = WorkspacePreempted(WS, "n1", "2025-06-10T11:00:00Z", cause="node_deleted")
    decision = decide(_ws(State.RUNNING, updated_at=T0), lost, NOW)
    assert decision.reason == Reason.PREEMPTED
    assert "n1 was removed from the cluster" in decision.message
    assert "no snapshot to resume from: delete it and create it again" in decision.message


def test_a_server_started_after_the_node_went_away_is_not_the_one_lost() -> None:
    # A resume onto another node (or onto the node's replacement of the same name).
    later = _ws(State.RUNNING, updated_at=datetime(2025, 6, 10, 11, 30, tzinfo=UTC))
    decision = decide(later, SIGNALS["node lost"], NOW)
    assert (decision.accepted, decision.reason) == (False, Reason.STALE_PREEMPTION)
    starting = _ws(State.RESUMING, transition_started_at=datetime(2025, 6, 10, 11, 5,
                                                                   tzinfo=UTC))
    assert decide(starting, SIGNALS["node lost"], NOW).reason == Reason.STALE_PREEMPTION


def test_a_runtime_alert_is_a_note_not_a_transition() -> None:
    running = _ws(State.RUNNING, updated_at=T0, state_message="")
    decision = decide(running, SIGNALS["runtime alert"], NOW)
    assert decision.accepted and not decision.changed_state and decision.workspace is not None
    noted = decision.workspace
    assert noted.state_message == "container workspace was OOM-killed"
    # The version (event ids, the idle pause's request id) and the moment it became
    # RUNNING (the idle clock) stay as they are.
    assert (noted.version, noted.updated_at, noted.state_reason) == (
        running.version, running.updated_at, running.state_reason)


def test_a_runtime_alert_from_before_this_server_started_is_stale() -> None:
    restarted = _ws(State.RUNNING, updated_at=datetime(2025, 6, 10, 11, 30, tzinfo=UTC))
    decision = decide(restarted, SIGNALS["runtime alert"], NOW)
    assert (decision.accepted, decision.reason) == (False, Reason.STALE_ALERT)
    assert "before this server started" in decision.message


def test_a_preemption_reported_for_a_queued_workspace_is_no_cancellation() -> None:
    queued = _ws(State.QUEUED)
    late = decide(queued, WorkspacePauseRequested(WS, "kueue", "preempted"), NOW)
    assert (late.accepted, late.reason) == (False, Reason.STALE_PREEMPTION)
    cancel = decide(queued, WorkspacePauseRequested(WS, "alice"), NOW)
    assert (cancel.accepted, cancel.reason) == (True, Reason.QUEUE_CANCELLED)
