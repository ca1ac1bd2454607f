"""Monitoring signals as a table: real-format payloads -> signals or refusals (pure).

The payloads under ``tests/data/monitoring/`` are written in the formats their senders
document: Cloud Monitoring's notification schema 1.2 (a GPU-idle incident on a workspace
container, its closing, GPU memory, an OOM kill from a PromQL policy, another team's VM
policy, the console's test notification), Cloud Logging entries (a Spot preemption in the
system-event audit log, a node deletion and a pod deletion in the cluster's admin-activity
audit log) and Alertmanager's webhook version 4 (a Stasis rule next to a foreign one, and
its resolution). Their times are fixed; ``AT`` is a minute after they were sent.
"""

from __future__ import annotations

import copy
import json
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import promql_parser
import pytest
import yaml

from events import (
    WorkspaceIdleDetected,
    WorkspacePreempted,
    WorkspaceRuntimeAlert,
    new_event,
)
from functions.domain import monitoring
from functions.domain.catalog import Catalog
from functions.domain.idle import GPU_BUSY_PERCENT
from functions.domain.lifecycle import State, Workspace
from functions.domain.monitoring import Kind, Refusal, WorkspaceRef
from functions.handlers.monitoring import match
from functions.kubernetes.objects import meta
from functions.kubernetes.objects.workspace import workspace_names
from stack.monitoring import restamp

DATA = Path(__file__).resolve().parents[1] / "data" / "monitoring"
#: A minute after the notifications were sent (incidents opened 14:02:11 UTC).
AT = datetime(2025, 6, 10, 14, 6, 11, tzinfo=UTC)
FINETUNE = "ml-a--llm-finetune"
VISION = "ml-b--vision"
NODE = "gke-stasis-prod-gpu-l4-spot-5b909138-nr65"


def load(name: str) -> Any:
    return json.loads((DATA / f"{name}.json").read_text())


def outcome(payload: Any, now: datetime = AT) -> list[tuple[str, str | None]]:
    """(signal kind, what it names) or (refusal reason, None), in order."""
    reading = monitoring.read(payload, now)
    names = [(str(s.kind), s.node or (s.workspace.label or s.workspace.pod
                                        if s.workspace else None)) for s in reading.signals]
    return names + [(str(r.reason), None) for r in reading.refused]


FINETUNE_LABEL = workspace_names("ml-a", FINETUNE).label
FINETUNE_POD = workspace_names("ml-a", FINETUNE).pod
VISION_POD = workspace_names("ml-b", VISION).pod

TABLE = [
    # (payload file, what it becomes)
    ("cloud-monitoring-gpu-idle", [("gpu_idle", FINETUNE_LABEL)]),
    ("cloud-monitoring-gpu-idle-closed", [("closed", None)]),
    ("cloud-monitoring-gpu-memory", [("gpu_memory_high", FINETUNE_LABEL)]),
    ("cloud-monitoring-oom-killed", [("oom_killed", FINETUNE_POD)]),
    ("cloud-monitoring-other-policy", [("unsupported", None)]),
    ("cloud-monitoring-test-connection", [("unsupported", None)]),
    ("cloud-logging-spot-preemption", [("spot_preemption", NODE)]),
    ("cloud-logging-node-deleted", [("node_deleted", NODE)]),
    ("cloud-logging-pod-deleted", [("unsupported", None)]),
    ("alertmanager-gpu-idle", [("gpu_idle", VISION_POD), ("unsupported", None)]),
    ("alertmanager-gpu-idle-resolved", [("closed", None)]),
]


def test_the_table_covers_every_saved_payload() -> None:
    assert {name for name, _ in TABLE} == {p.stem for p in DATA.glob("*.json")}


@pytest.mark.parametrize(("name", "expected"), TABLE, ids=[name for name, _ in TABLE])
def test_each_saved_payload_reads_as_expected(name: str, expected: list[Any]) -> None:
    assert outcome(load(name)) == expected
    for refused in monitoring.read(load(name), AT).refused:
        assert len(refused.message) > 20  # a reason a person can act on


def test_the_labels_read_are_those_the_builders_put_on_the_pod() -> None:
    assert (monitoring.LABEL_WORKSPACE, monitoring.LABEL_TEAM) == (meta.LABEL_WORKSPACE,
                                                                  meta.LABEL_TEAM)


def test_the_fixtures_name_the_pods_the_builders_make() -> None:
    # What the Kubernetes runtime puts on a workspace pod is what the payloads carry.
    incident = load("cloud-monitoring-gpu-idle")["incident"]
    labels = incident["metadata"]["user_labels"]
    assert (labels["stasis.dev/workspace"], labels["stasis.dev/team"]) == (FINETUNE_LABEL, "ml-a")
    assert incident["resource"]["labels"]["pod_name"] == FINETUNE_POD


def test_a_gpu_idle_incident_carries_its_duty_cycle_threshold_and_window() -> None:
    (signal,) = monitoring.read(load("cloud-monitoring-gpu-idle"), AT).signals
    assert (signal.value, signal.threshold) == (0.0, 10.0)
    assert signal.observed_at == datetime(2025, 6, 10, 14, 2, 11, tzinfo=UTC)
    assert signal.workspace == WorkspaceRef(label=FINETUNE_LABEL, team="ml-a",
                                            namespace="stasis-ml-a", pod=FINETUNE_POD)
    assert signal.detail.startswith("GPU duty cycle 0% (under 10% for 20m)")
    assert "incident 0.nv2r1nqj2j3k (stasis-gpu-idle)" in signal.detail
    assert signal.key == "cloud_monitoring 0.nv2r1nqj2j3k open"


def test_the_policy_label_wins_and_the_metric_type_is_the_fallback() -> None:
    payload = load("cloud-monitoring-gpu-idle")
    del payload["incident"]["policy_user_labels"]
    assert outcome(payload)[0][0] == "gpu_idle"
    payload["incident"]["metric"]["type"] = "kubernetes.io/container/cpu/limit_utilization"
    assert outcome(payload) == [("unsupported", None)]
    payload["incident"]["policy_user_labels"] = {"stasis_signal": "oom_killed"}
    assert outcome(payload)[0][0] == "oom_killed"


def test_an_old_incident_or_log_entry_is_stale() -> None:
    late = AT + monitoring.MAX_ALERT_AGE
    assert outcome(load("cloud-monitoring-gpu-idle"), late) == [("stale", None)]
    assert outcome(load("alertmanager-gpu-idle"), late + timedelta(minutes=8)) == [
        ("stale", None), ("unsupported", None)]
    assert outcome(load("cloud-logging-spot-preemption"), AT + monitoring.MAX_LOG_AGE) == [
        ("stale", None)]
    assert outcome(load("cloud-logging-spot-preemption"), AT + timedelta(hours=5))[0][0] == \
        "spot_preemption"


def test_an_alert_without_an_end_is_current_only_near_its_start() -> None:
    payload = load("alertmanager-gpu-idle")
    alert = payload["alerts"][0]
    alert["endsAt"] = "0001-01-01T00:00:00Z"  # Alertmanager's "no end yet"
    assert outcome(payload)[0] == ("gpu_idle", VISION_POD)
    assert outcome(payload, AT + timedelta(minutes=10))[0] == ("stale", None)


@pytest.mark.parametrize(("change", "reason"), [
    (lambda p: p["incident"].pop("incident_id"), Refusal.MALFORMED),
    (lambda p: p["incident"].update(started_at="yesterday"), Refusal.MALFORMED),
    (lambda p: p["incident"].update(state="acknowledged"), Refusal.MALFORMED),
    (lambda p: p.update(version="1.1"), Refusal.UNSUPPORTED),
    (lambda p: p["incident"].update(metadata={}, resource={"type": "k8s_container"}),
     Refusal.NO_WORKSPACE),
])
def test_a_broken_incident_is_refused_with_its_reason(change: Any, reason: Refusal) -> None:
    payload = load("cloud-monitoring-gpu-idle")
    change(payload)
    assert outcome(payload) == [(str(reason), None)]


@pytest.mark.parametrize(("payload", "reason"), [
    ([1, 2], Refusal.MALFORMED),
    ("incident", Refusal.MALFORMED),
    ({"hello": "world"}, Refusal.UNSUPPORTED),
    ({"version": "4", "alerts": []}, Refusal.MALFORMED),
    ({"version": "3", "alerts": [{}]}, Refusal.UNSUPPORTED),
    ({"version": "4", "alerts": ["firing"]}, Refusal.MALFORMED),
    ({"version": "4", "alerts": [{"status": "pending", "startsAt": "2025-06-10T14:05:00Z",
                                  "labels": {"stasis_signal": "gpu_idle", "pod": "ws-x"}}]},
     Refusal.MALFORMED),
    ({"version": "4", "alerts": [{"status": "firing", "startsAt": "2025-06-10T14:05:00Z",
                                  "labels": {"stasis_signal": "gpu_idle"}}]},
     Refusal.NO_WORKSPACE),
    ({"logName": "projects/p/logs/x",
      "protoPayload": {"methodName": "v1.compute.instances.insert"}}, Refusal.UNSUPPORTED),
])
def test_other_bad_input_is_refused_with_its_reason(payload: Any, reason: Refusal) -> None:
    assert outcome(payload) == [(str(reason), None)]


def test_a_log_entry_without_its_ids_is_malformed_and_a_failed_deletion_lost_nothing() -> None:
    entry = load("cloud-logging-spot-preemption")
    del entry["insertId"]
    assert outcome(entry) == [("malformed", None)]
    deleted = load("cloud-logging-node-deleted")
    deleted["protoPayload"]["status"] = {"code": 7, "message": "forbidden"}
    assert outcome(deleted) == [("unsupported", None)]


def test_log_timestamps_keep_their_nanoseconds_to_the_microsecond() -> None:
    (signal,) = monitoring.read(load("cloud-logging-node-deleted"), AT).signals
    assert signal.observed_at == datetime(2025, 6, 10, 14, 5, 40, 118273, tzinfo=UTC)
    entry = load("cloud-logging-node-deleted")
    entry["timestamp"] = "2025-06-10T14:05:40.118273054Z"
    assert monitoring.read(entry, AT).signals[0].observed_at == signal.observed_at


def test_prometheus_exported_labels_name_the_workload_not_the_exporter() -> None:
    payload = load("alertmanager-gpu-idle")
    labels = payload["alerts"][0]["labels"]
    labels["exported_pod"], labels["pod"] = labels["pod"], "dcgm-exporter-x7k2p"
    assert outcome(payload)[0] == ("gpu_idle", VISION_POD)


# -- finding the workspace ------------------------------------------------------------------
def _ws(ws_id: str, state: State = State.RUNNING) -> Workspace:
    team, _, name = ws_id.partition("--")
    return Workspace(id=ws_id, team=team, owner="alice", name=name, profile="gpu-small",
                     state=state)


CANDIDATES = [_ws("ml-a--other"), _ws(FINETUNE), _ws(VISION)]


def test_a_pod_label_or_a_pod_name_finds_its_workspace_and_nothing_else() -> None:
    assert match(WorkspaceRef(label=FINETUNE_LABEL, team="ml-a"),
                            CANDIDATES) == CANDIDATES[1]
    assert match(WorkspaceRef(namespace="stasis-ml-b", pod=VISION_POD),
                            CANDIDATES) == CANDIDATES[2]
    # A team label that disagrees, a label of nobody, the raw id: no match.
    assert match(WorkspaceRef(label=FINETUNE_LABEL, team="ml-b"), CANDIDATES) is None
    assert match(WorkspaceRef(label="ml-a-gone--0123456789"), CANDIDATES) is None
    assert match(WorkspaceRef(label=FINETUNE), CANDIDATES) is None
    # The label wins over a pod name that says otherwise.
    assert match(WorkspaceRef(label=FINETUNE_LABEL, pod=VISION_POD),
                            CANDIDATES) == CANDIDATES[1]


def test_a_lost_node_names_the_workspaces_the_runtime_placed_on_it() -> None:
    placements = [(FINETUNE, NODE), (VISION, "gke-other"), ("ml-a--cpu", None),
                  (FINETUNE, NODE)]
    assert monitoring.on_node(NODE, placements) == [FINETUNE]
    assert monitoring.on_node("gke-empty", placements) == []


# -- the events -----------------------------------------------------------------------------
def test_a_gpu_idle_signal_is_evidence_for_the_idle_policy_never_a_pause() -> None:
    (signal,) = monitoring.read(load("cloud-monitoring-gpu-idle"), AT).signals
    payload = monitoring.event_for(signal, FINETUNE)
    assert isinstance(payload, WorkspaceIdleDetected)
    assert (payload.cause, payload.gpu_utilization) == ("gpu_idle", 0.0)
    # Monitoring does not know when the user last did something: "when observed" is the
    # answer that makes nothing look idle; the idle handler asks the runtime.
    assert payload.last_activity == payload.observed_at == signal.observed_at.isoformat()
    assert payload.busy_kernels == 0 and payload.evidence == signal.detail
    new_event(payload)  # valid against its schema


def test_lost_nodes_and_alerts_become_their_events() -> None:
    (lost,) = monitoring.read(load("cloud-logging-spot-preemption"), AT).signals
    preempted = monitoring.event_for(lost, FINETUNE)
    assert isinstance(preempted, WorkspacePreempted)
    assert (preempted.node, preempted.cause) == (NODE, "spot_preemption")
    assert preempted.preempted_at == "2025-06-10T14:02:11.325309+00:00"
    (memory,) = monitoring.read(load("cloud-monitoring-gpu-memory"), AT).signals
    alert = monitoring.event_for(memory, FINETUNE)
    assert isinstance(alert, WorkspaceRuntimeAlert)
    assert (alert.alert, alert.value, alert.threshold) == ("gpu_memory_high", 0.981, 0.95)
    assert alert.detail.startswith("GPU memory 98% used (over 95% for 5m)")
    for payload in (preempted, alert):
        new_event(payload)


def test_event_ids_are_one_per_notification_and_workspace() -> None:
    (signal,) = monitoring.read(load("cloud-logging-spot-preemption"), AT).signals
    again = monitoring.read(load("cloud-logging-spot-preemption"), AT + timedelta(minutes=1))
    assert monitoring.event_id(signal, FINETUNE) == monitoring.event_id(again.signals[0],
                                                                        FINETUNE)
    assert monitoring.event_id(signal, FINETUNE) != monitoring.event_id(signal, VISION)
    incident = monitoring.read(load("cloud-monitoring-gpu-idle"), AT).signals[0]
    assert incident.key != signal.key


# -- replaying a saved one (`stasis events monitoring --restamp`) ---------------------------
@pytest.mark.parametrize("name", [n for n, e in TABLE if e[0][0] not in ("unsupported",
                                                                          "closed")])
def test_a_restamped_payload_is_fresh_and_new(name: str) -> None:
    much_later = AT + timedelta(days=30)
    payload = load(name)
    before = copy.deepcopy(payload)
    assert outcome(payload, much_later)[0] == ("stale", None)
    fresh = restamp(payload, much_later)
    assert payload == before  # the saved one is untouched
    old, new = monitoring.read(payload, AT).signals[0], monitoring.read(fresh, much_later)
    assert new.signals and new.signals[0].kind == old.kind and new.signals[0].key != old.key


# -- examples/: the Prometheus rules, the Alertmanager receiver, the sample incident ----------
EXAMPLES = Path(__file__).resolve().parents[2] / "examples"


def _rules() -> list[dict[str, Any]]:
    return yaml.safe_load((EXAMPLES / "prometheus" / "stasis-rules.yaml").read_text())[
        "groups"][0]["rules"]


def test_the_example_rules_parse_as_promql_and_name_every_signal() -> None:
    signals = set()
    for rule in _rules():
        promql_parser.parse(rule["expr"])  # raises ValueError on a syntax error
        signals.add(rule["labels"][monitoring.SIGNAL_LABEL])
        assert "namespace, pod, container" in rule["expr"], rule["alert"]  # names the pod
    assert signals == set(monitoring.ALERT_KINDS)


def test_the_example_gpu_idle_rule_uses_the_policys_threshold_and_window() -> None:
    catalog = Catalog.from_config(yaml.safe_load((EXAMPLES / "stasis.yaml").read_text()))
    window = min(rule.idle_seconds for p in catalog.profiles.values()
                 if p.accelerator and p.accelerator.type.startswith("nvidia")
                 for rule in p.idle_policy.rules if rule.effect.value == "pause")
    (rule,) = [r for r in _rules() if r["labels"]["stasis_signal"] == "gpu_idle"]
    expr = promql_parser.parse(rule["expr"])
    assert str(expr.op) == "<" and expr.rhs.val == GPU_BUSY_PERCENT
    (selector,) = expr.lhs.expr.args
    assert selector.range == timedelta(seconds=window)
    assert selector.vector_selector.name == "DCGM_FI_DEV_GPU_UTIL"
    assert rule["annotations"]["threshold"] == f"{GPU_BUSY_PERCENT:g}"


def test_an_alert_from_the_example_rules_reads_as_its_signal() -> None:
    # What Alertmanager sends for the GPU-idle rule (its labels: the rule's and the series').
    (rule,) = [r for r in _rules() if r["labels"]["stasis_signal"] == "gpu_idle"]
    alert = {"status": "firing", "startsAt": "2025-06-10T14:05:00Z",
             "endsAt": "2025-06-10T14:12:00Z", "fingerprint": "9c1d",
             "labels": {"alertname": rule["alert"], **rule["labels"],
                        "namespace": "stasis-ml-b", "pod": VISION_POD, "container": "workspace"},
             "annotations": {"value": "3.5", "threshold": rule["annotations"]["threshold"]}}
    assert outcome({"version": "4", "alerts": [alert]}) == [("gpu_idle", VISION_POD)]


def test_the_example_receiver_authenticates_and_takes_only_stasis_alerts() -> None:
    config = yaml.safe_load((EXAMPLES / "prometheus" / "alertmanager.yaml").read_text())
    (route,) = config["route"]["routes"]
    assert all(kind in route["matchers"][0] for kind in monitoring.ALERT_KINDS)
    (hook,) = config["receivers"][0]["webhook_configs"]
    assert hook["http_config"]["authorization"]["type"] == "Bearer"
    assert hook["http_config"]["authorization"]["credentials_file"]
    assert hook["send_resolved"] is True


def test_the_sample_incident_names_the_readmes_workspace() -> None:
    payload = json.loads((EXAMPLES / "monitoring" / "gpu-idle-incident.json").read_text())
    (signal,) = monitoring.read(restamp(payload, AT), AT).signals
    assert signal.kind == Kind.GPU_IDLE and signal.workspace is not None
    assert match(signal.workspace, [_ws("ml-a--mynb"), _ws(FINETUNE)]).id == \
        "ml-a--mynb"
