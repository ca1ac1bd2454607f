"""The Terraform deployment (terraform/) checked without `terraform init` (the registry is out
of reach in CI): every file parses (python-hcl2), checkov passes, and the deployment agrees
with the code: every event has its topic, every consumer its trigger and dead-letter topic,
every function of functions/routes.py is deployed with its exposure, the Firestore indexes
are those of the declared queries, every secret the functions read is declared, and the
cluster objects come from the Kubernetes builders with nothing left unfilled.

The functions, the topics, the indexes and the cluster objects are not written in
Terraform: `stasis bundle` generates them (deploy/tfvars.py). So the consistency tests check
two things: the generator reflects the code, and the Terraform consumes every generated
value. (That every query the code runs is declared is checked where queries run: the
dashboard's port, and tests/index_guard.py in the integration tier.)
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import hcl2  # python-hcl2, a test dependency
import pytest
import yaml

from deploy import cluster, indexes
from deploy import tfvars as generated
from events import CATALOG
from functions.delivery import MAX_DELIVERY_ATTEMPTS, dead_letter_topic
from functions.domain import publishers
from functions.domain.catalog import Catalog
from functions.domain.idle import GPU_BUSY_PERCENT
from functions.domain.monitoring import ALERT_KINDS, NODE_DELETED_METHOD, PREEMPTED_METHOD
from functions.handlers.monitoring import TOPIC
from functions.kubernetes.objects import meta
from functions.queries import IndexedQuery
from functions.routes import FUNCTIONS, HTTP_FUNCTIONS, PUBLISHERS, ROUTES, Exposure

ROOT = Path(__file__).resolve().parents[2]
TF = ROOT / "terraform"
MODULES = TF / "modules"
ENVIRONMENTS = sorted(p for p in (TF / "environments").iterdir() if p.is_dir())
CHECKOV_VENV = ROOT / "build" / "checkov-venv"
CHECKOV_SPEC = "checkov>=3.2,<4"
#: An environment variable whose name says it holds a secret.
SECRET_NAME = re.compile(r"SECRET|TOKEN|PASSWORD|PASSWD|PRIVATE_KEY|API_KEY|CREDENTIAL")
ENV_READ = re.compile(
    r"""(?:environ(?:\.get)?\(|environ\[|getenv\(|\benv\()\s*["']([A-Z][A-Z0-9_]+)["']"""
)


# --- reading HCL -------------------------------------------------------------------------------
def _unquote(value: Any) -> Any:
    if isinstance(value, str) and len(value) >= 2 and value[0] == value[-1] == '"':
        return value[1:-1]
    if isinstance(value, list):
        return [_unquote(v) for v in value]
    if isinstance(value, dict):
        return {_unquote(k): _unquote(v) for k, v in value.items()}
    return value


@pytest.fixture(scope="module")
def parsed() -> dict[Path, dict[str, Any]]:
    """Every .tf file, parsed once (unquoted)."""
    found: dict[Path, dict[str, Any]] = {}
    errors = []
    for path in sorted(TF.rglob("*.tf")):
        if ".terraform" in path.parts:
            continue
        try:
            with path.open() as f:
                found[path] = _unquote(hcl2.load(f))
        except Exception as exc:  # the parser raises lark errors of several kinds
            errors.append(f"{path.relative_to(ROOT)}: {exc}")
    assert not errors, "\n".join(errors)
    return found


def _blocks(
    parsed: dict[Path, dict[str, Any]], kind: str, under: Path = TF
) -> Iterator[tuple[Path, str, dict[str, Any]]]:
    """(file, label, body) of every ``kind`` block (variable, output, module, ...)."""
    for path, data in parsed.items():
        if under not in path.parents:
            continue
        for block in data.get(kind, []):
            for label, body in block.items():
                if not label.startswith("__"):
                    yield path, label, body


def _resources(
    parsed: dict[Path, dict[str, Any]], under: Path = TF
) -> Iterator[tuple[Path, str, str, dict[str, Any]]]:
    for path, data in parsed.items():
        if under not in path.parents:
            continue
        for block in data.get("resource", []):
            for rtype, named in block.items():
                for name, body in named.items():
                    if not name.startswith("__"):
                        yield path, rtype, name, body


def _resource(
    parsed: dict[Path, dict[str, Any]], module: str, rtype: str, name: str
) -> dict[str, Any]:
    for _, t, n, body in _resources(parsed, MODULES / module):
        if (t, n) == (rtype, name):
            return body
    raise AssertionError(f"modules/{module} has no {rtype}.{name}")


def _locals(parsed: dict[Path, dict[str, Any]], path: Path) -> dict[str, Any]:
    merged: dict[str, Any] = {}
    for block in parsed[path].get("locals", []):
        merged.update({k: v for k, v in block.items() if not k.startswith("__")})
    return merged


# --- the generated values ----------------------------------------------------------------------
@pytest.fixture(scope="module")
def queries() -> list[IndexedQuery]:
    return [q for found in indexes.declared().values() for q in found]


@pytest.fixture(scope="module")
def plan() -> generated.Deployment:
    return generated.deployment()


@pytest.fixture(scope="module")
def tfvars(plan: generated.Deployment) -> dict[str, Any]:
    return plan.tfvars("../../../build/stasis-functions.zip", "0" * 64)


# --- syntax, typing, pinning -------------------------------------------------------------------
def test_every_tf_file_parses(parsed: dict[Path, dict[str, Any]]) -> None:
    assert len(parsed) >= 40, sorted(str(p) for p in parsed)
    assert {p.name for p in MODULES.iterdir()} >= {
        "pubsub",
        "functions",
        "firestore",
        "storage",
        "kms",
        "scheduler",
        "secrets",
        "iap",
        "gke",
        "kubernetes",
        "network",
        "project",
        "stasis",
    }
    assert {e.name for e in ENVIRONMENTS} >= {"dev", "prod"}


def test_every_variable_is_typed_and_described(parsed: dict[Path, dict[str, Any]]) -> None:
    bad = [
        f"{path.relative_to(TF)}: {name} lacks {what}"
        for path, name, body in _blocks(parsed, "variable")
        for what in ("type", "description")
        if not body.get(what)
    ]
    assert not bad, "\n".join(bad)
    undescribed = [
        f"{path.relative_to(TF)}: output {name}"
        for path, name, body in _blocks(parsed, "output")
        if not body.get("description")
    ]
    assert not undescribed, "\n".join(undescribed)


def test_providers_are_pinned(parsed: dict[Path, dict[str, Any]]) -> None:
    """Every module and environment pins each provider it uses with a bounded range; the
    environments pin google, google-beta and kubernetes to the same ranges as the modules."""
    ranges: dict[str, set[str]] = {}
    for path, data in parsed.items():
        for block in data.get("terraform", []):
            for providers in block.get("required_providers", []):
                for name, spec in providers.items():
                    if name.startswith("__"):
                        continue
                    version = spec.get("version", "")
                    assert "<" in version and ">=" in version, (
                        f"{path.relative_to(TF)}: {name} is not pinned to a range: {version!r}"
                    )
                    ranges.setdefault(name, set()).add(version)
    assert {"google", "google-beta", "kubernetes"} <= set(ranges)
    assert all(len(v) == 1 for v in ranges.values()), f"providers pinned differently: {ranges}"

    used = re.compile(r'^resource "(google|kubernetes)_', re.M)
    for module in MODULES.iterdir():
        text = "".join(p.read_text() for p in module.glob("*.tf"))
        declared = (module / "versions.tf").read_text()
        for provider in set(used.findall(text)):
            assert f"{provider} = {{" in declared, f"modules/{module.name} uses {provider}"
    for env in ENVIRONMENTS:
        text = (env / "versions.tf").read_text()
        assert all(f"{p} = {{" in text for p in ("google", "google-beta", "kubernetes")), env


def test_terraform_fmt_is_clean() -> None:
    """`terraform fmt` needs no provider; run it where the binary exists."""
    binary = shutil.which("terraform")
    if binary is None:
        pytest.skip("terraform is not installed here (python-hcl2 still parses every file)")
    result = subprocess.run(
        [binary, "fmt", "-recursive", "-check", "-list=true", str(TF)],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 0, f"run `terraform fmt -recursive terraform`:\n{result.stdout}"


# --- checkov -------------------------------------------------------------------------------------
def _checkov() -> Path:
    """checkov pins packaging<24, which the test tools do not accept, so it lives in a venv
    of its own: $STASIS_CHECKOV, else build/checkov-venv (made here on first use, about 90 s
    with pip), else one on PATH."""
    configured = os.environ.get("STASIS_CHECKOV")
    if configured:
        return Path(configured)
    local = CHECKOV_VENV / "bin" / "checkov"
    if local.exists():
        return local
    on_path = shutil.which("checkov")
    if on_path:
        return Path(on_path)
    made = subprocess.run(
        [sys.executable, "-m", "venv", str(CHECKOV_VENV)], capture_output=True, text=True
    )
    pip = CHECKOV_VENV / "bin" / "pip"
    installed = (
        made.returncode == 0
        and subprocess.run(
            [str(pip), "install", "--quiet", CHECKOV_SPEC],
            capture_output=True,
            text=True,
            timeout=600,
        ).returncode
        == 0
    )
    if not installed or not local.exists():
        shutil.rmtree(CHECKOV_VENV, ignore_errors=True)
        pytest.fail(
            f"checkov is not available: create it with `python3 -m venv "
            f"{CHECKOV_VENV.relative_to(ROOT)} && {CHECKOV_VENV.relative_to(ROOT)}"
            f"/bin/pip install '{CHECKOV_SPEC}'` or set STASIS_CHECKOV"
        )
    return local


@pytest.mark.timeout(900)
def test_checkov_passes() -> None:
    """No failed check; the skipped ones are skipped in line, each with its reason. Takes
    about 40 s (plus about 90 s once to install checkov into build/checkov-venv)."""
    result = subprocess.run(
        [
            str(_checkov()),
            "--framework",
            "terraform",
            "--quiet",
            "--compact",
            "--skip-download",
            "-d",
            "terraform",
        ],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=600,
        env={**os.environ, "BC_SKIP_MAPPING": "TRUE"},
    )
    summary = re.search(
        r"Passed checks: (\d+), Failed checks: (\d+), Skipped checks: (\d+)", result.stdout
    )
    assert summary, f"checkov did not run:\n{result.stdout[-3000:]}\n{result.stderr[-3000:]}"
    assert result.returncode == 0 and summary.group(2) == "0", result.stdout[-6000:]
    assert int(summary.group(1)) > 50  # it did look at the modules


def test_every_checkov_skip_has_a_reason() -> None:
    skips = [
        (p, line)
        for p in TF.rglob("*.tf")
        for line in p.read_text().splitlines()
        if "checkov:skip" in line
    ]
    assert skips
    for path, line in skips:
        assert re.search(r"#checkov:skip=CKV2?_[A-Z0-9_]+:\S.{20,}", line), (
            f"{path.relative_to(ROOT)}: a skip needs its reason: {line.strip()}"
        )


# --- events, triggers, dead letters -------------------------------------------------------------
def test_every_event_has_its_topic(tfvars: dict[str, Any]) -> None:
    assert tfvars["event_topics"] == {name: spec.topic for name, spec in CATALOG.items()}
    assert all(re.fullmatch(r"stasis-[a-z0-9-]+", t) for t in tfvars["event_topics"].values())


def test_every_consumer_has_its_trigger_and_dead_letter_topic(tfvars: dict[str, Any]) -> None:
    functions = tfvars["event_functions"]
    assert set(functions) == set(ROUTES)
    for name, route in ROUTES.items():
        f = functions[name]
        # A Raw route (monitoring) takes no event: the raw messages of its own topic.
        topic = CATALOG[route.event].topic if route.event is not None else route.topic
        assert f["event"] == route.event and f["topic"] == topic
        assert f["dead_letter_topic"] == dead_letter_topic(name) == route.dead_letter_topic
        # The names the local stack uses too (stack/topology.py): one topology, two places.
        assert f["subscription"] == route.subscription
        assert f["dead_letter_subscription"] == route.dead_letter_subscription
        assert f["ordered"] is (
            route.event in {"workspace.requested", "workspace.resume_requested"}
        )
    names = [f[k] for f in functions.values()
             for k in ("dead_letter_topic", "subscription", "dead_letter_subscription")]
    assert len(set(names)) == len(names)
    assert all(re.fullmatch(r"[A-Za-z][A-Za-z0-9._~+%-]{2,254}", n) for n in names)
    assert tfvars["max_delivery_attempts"] == MAX_DELIVERY_ATTEMPTS == 5


def test_pubsub_module_builds_topics_triggers_and_dead_letters(
    parsed: dict[Path, dict[str, Any]],
) -> None:
    topics = _resource(parsed, "pubsub", "google_pubsub_topic", "events")
    assert topics["for_each"] == "${var.event_topics}" and topics["name"] == "${each.value}"
    dlq = _resource(parsed, "pubsub", "google_pubsub_topic", "dead_letters")
    assert dlq["for_each"] == "${var.event_functions}"
    assert dlq["name"] == "${each.value.dead_letter_topic}"
    dlq_sub = _resource(parsed, "pubsub", "google_pubsub_subscription", "dead_letters")
    assert dlq_sub["name"] == "${each.value.dead_letter_subscription}"

    push = _resource(parsed, "pubsub", "google_pubsub_subscription", "push")
    assert "var.event_functions" in push["for_each"]
    # An event's topic, or the raw topic of a Raw route (pushed in Eventarc mode too).
    assert "google_pubsub_topic.events[each.value.event].id" in push["topic"]
    assert "google_pubsub_topic.raw[each.value.topic].id" in push["topic"]
    assert "f.event == null" in push["for_each"]
    assert push["enable_message_ordering"] == "${each.value.ordered}"
    retry = push["retry_policy"][0]
    assert retry["minimum_backoff"] and retry["maximum_backoff"]  # exponential backoff
    policy = push["dead_letter_policy"][0]
    assert policy["max_delivery_attempts"] == "${var.max_delivery_attempts}"
    assert policy["dead_letter_topic"] == "${google_pubsub_topic.dead_letters[each.key].id}"
    assert push["push_config"][0]["oidc_token"]

    # The Pub/Sub service agent may forward to every dead-letter topic and take from every
    # source subscription.
    dlq_iam = _resource(
        parsed, "pubsub", "google_pubsub_topic_iam_binding", "dead_letter_publishers"
    )
    assert "var.pubsub_agent" in json.dumps(dlq_iam["members"])
    agent_sub = _resource(parsed, "pubsub", "google_pubsub_subscription_iam_member", "push_agent")
    assert agent_sub["role"] == "roles/pubsub.subscriber"
    assert agent_sub["member"] == "serviceAccount:${var.pubsub_agent}"


def test_eventarc_mode_retries_and_attaches_dead_letters(
    parsed: dict[Path, dict[str, Any]],
) -> None:
    fn = _resource(parsed, "functions", "google_cloudfunctions2_function", "this")
    trigger = next(d["event_trigger"] for d in fn["dynamic"] if "event_trigger" in d)
    trigger = trigger["content"][0]
    assert trigger["retry_policy"] == "RETRY_POLICY_RETRY"
    assert trigger["event_type"] == "google.cloud.pubsub.topic.v1.messagePublished"
    step = _resource(parsed, "functions", "terraform_data", "eventarc_dead_letters")
    command = step["provisioner"][0]["local-exec"]["command"]
    assert "--dead-letter-topic" in command and "--max-delivery-attempts" in command


# --- who may publish what ------------------------------------------------------------------------
_PUBLISH_ROLES = {"roles/pubsub.publisher", "roles/pubsub.editor", "roles/pubsub.admin",
                  "roles/editor", "roles/owner"}


def _component_members(parsed: dict[Path, dict[str, Any]]) -> dict[str, str]:
    """modules/stasis' ``component_members``, read from its HCL: component -> the member
    expression it publishes as; every function as ``local.member[<function>]``."""
    expression = _locals(parsed, MODULES / "stasis" / "main.tf")["component_members"]
    functions, _, outside = expression.partition("}, {")
    # every function as its own account, and nothing else
    assert functions == "${merge({for n, m in local.member : n => [m]", functions
    members = {name: f"local.member[{name}]" for name in FUNCTIONS}
    for name, value in re.findall(r"(\w+) = (\[[^\]]*\]|[\w.]+)", outside):
        assert name not in members, f"{name} is a function and an outside component"
        members[name] = value
    return members


def test_every_topic_s_publishers_are_the_derived_table(
    tfvars: dict[str, Any], parsed: dict[Path, dict[str, Any]]
) -> None:
    """The grants, evaluated from the HCL: each topic's members are the identities of
    exactly the components the code says emit that event (functions/routes.py PUBLISHERS),
    each function as its own service account; none may publish what it never emits."""
    assert tfvars["event_publishers"] == {
        event: sorted(PUBLISHERS.get(event, ())) for event in CATALOG}
    members = _component_members(parsed)
    assert set(members) == {*FUNCTIONS, *publishers.EXTERNAL}
    assert members[publishers.OPERATOR] == "var.publishers"
    assert members[publishers.MONITOR] == "[google_service_account.monitor.member]"
    assert members[publishers.IDE_PROXY] == "[google_service_account.ide_proxy.member]"
    for local_only in (publishers.NODE_AGENT, publishers.NULL_RUNTIME, publishers.WORKSPACE):
        assert members[local_only] == "[]", local_only
    granted = {event: {members[c] for c in components}
               for event, components in tfvars["event_publishers"].items()}
    for name, function in FUNCTIONS.items():
        own = {event for event, who in granted.items() if f"local.member[{name}]" in who}
        assert own == set(function.emits), name
    # the public chat function and the proxy cannot forge what a runtime reports
    for outcome in ("snapshot.finished", "sandbox.finished", "workspace.ready"):
        assert not granted[outcome] & {"local.member[chat]", "local.member[proxy]"}
    # nor the cluster monitor a person's create or delete
    for request in ("workspace.requested", "workspace.delete_requested"):
        assert "[google_service_account.monitor.member]" not in granted[request]

    stasis = _locals(parsed, MODULES / "stasis" / "main.tf")
    assert stasis["topic_publishers"] == (
        "${{for event, components in var.event_publishers : event => sort(distinct(flatten("
        "[for c in components : local.component_members[c]])))}}")
    module = next(body for _, name, body in _blocks(parsed, "module", MODULES / "stasis")
                  if name == "pubsub")
    assert module["publishers"] == "${local.topic_publishers}"
    binding = _resource(parsed, "pubsub", "google_pubsub_topic_iam_binding", "publishers")
    assert binding["members"] == "${sort(distinct(var.publishers[each.key]))}"
    assert binding["role"] == "roles/pubsub.publisher"
    assert "google_pubsub_topic.events" in binding["for_each"]


def test_no_other_grant_lets_anyone_publish(parsed: dict[Path, dict[str, Any]]) -> None:
    """Publishing rights come only from the table (event topics), the delivery guard's
    dead-letter topics and the monitoring topic's own senders; no project-wide role."""
    found = {(path.parent.name, name) for path, rtype, name, body in _resources(parsed)
             if body.get("role") in _PUBLISH_ROLES
             or any(role in json.dumps(body.get("roles", "")) for role in _PUBLISH_ROLES)}
    assert found == {("pubsub", "publishers"), ("pubsub", "dead_letter_publishers"),
                     ("monitoring", "publishers")}
    monitoring_topic = _resource(parsed, "monitoring", "google_pubsub_topic_iam_binding",
                                 "publishers")
    assert monitoring_topic["topic"] == "${var.topic_id}"  # the raw topic, no event's


# --- functions -----------------------------------------------------------------------------------
def test_every_function_is_deployed(
    tfvars: dict[str, Any], parsed: dict[Path, dict[str, Any]]
) -> None:
    deployed = set(tfvars["event_functions"]) | set(tfvars["http_functions"])
    assert deployed == set(FUNCTIONS), "routes.py and the generated functions disagree"
    assert set(tfvars["http_functions"]) == set(HTTP_FUNCTIONS)
    for name, route in HTTP_FUNCTIONS.items():
        f = tfvars["http_functions"][name]
        assert (f["access"], f.get("schedule")) == (route.exposure, route.schedule), name
    # ...and Terraform deploys each generated function, with its name as entry point.
    fn = _resource(parsed, "functions", "google_cloudfunctions2_function", "this")
    assert fn["for_each"] == "${var.functions}"
    assert fn["build_config"][0]["entry_point"] == "${each.key}"
    stasis = (MODULES / "stasis" / "main.tf").read_text()
    assert "var.event_functions" in stasis and "var.http_functions" in stasis
    assert re.search(r"functions\s+= local\.functions", stasis)


def test_functions_have_own_accounts_and_least_access(tfvars: dict[str, Any]) -> None:
    functions = {**tfvars["event_functions"], **tfvars["http_functions"]}
    ids = [f["account_id"] for f in functions.values()]
    fixed = {
        "stasis-pubsub-push",
        "stasis-scheduler",
        "stasis-monitor",
        "stasis-gke-nodes",
        "stasis-functions-build",
    }
    assert len(set(ids)) == len(ids) and not set(ids) & fixed
    for name, f in functions.items():
        assert re.fullmatch(r"[a-z][a-z0-9-]{4,28}[a-z0-9]", f["account_id"]), name
        assert re.fullmatch(r"[a-z]([-a-z0-9]{0,47}[a-z0-9])?", f["deploy_name"]), name
        assert f["access"] in {"event", *Exposure}
    public = {n for n, f in functions.items() if f["access"] == "public"}
    # Slack signs its requests, Alertmanager sends its bearer token, a workspace its identity
    # (events.identity); the functions verify them.
    assert public == {"chat", "alertmanager", "workspace_api"}
    assert all(f["access"] == "event" for f in tfvars["event_functions"].values())
    schedules = {n: f.get("schedule") for n, f in tfvars["http_functions"].items()}
    assert schedules.get("reconcile"), "the reconciler runs on a schedule"
    for periodic in ("janitor", "idle_sweep"):
        if periodic in schedules:
            assert schedules[periodic], periodic


def test_long_function_names_still_get_valid_unique_identities() -> None:
    a = generated.account_id("on_workspace_state_changed_for_the_audit_export")
    b = generated.account_id("on_workspace_state_changed_for_the_audit_exports")
    assert a != b and all(
        len(x) <= 30 and re.fullmatch(r"[a-z][a-z0-9-]*[a-z0-9]", x) for x in (a, b)
    )
    assert len(generated.deploy_name("x" * 80)) <= 49


def test_environments_declare_and_pass_every_generated_variable(
    tfvars: dict[str, Any], parsed: dict[Path, dict[str, Any]]
) -> None:
    for env in ENVIRONMENTS:
        declared = {name for _, name, _ in _blocks(parsed, "variable", env)}
        missing = set(tfvars) - declared
        assert not missing, f"{env.name} does not declare {sorted(missing)}"
        module = next(body for _, name, body in _blocks(parsed, "module", env) if name == "stasis")
        for key in tfvars:
            assert module.get(key) == f"${{var.{key}}}", f"{env.name} does not pass {key}"
    stasis_vars = {name for _, name, _ in _blocks(parsed, "variable", MODULES / "stasis")}
    assert set(tfvars) <= stasis_vars


def test_chat_min_instances_is_configurable(parsed: dict[Path, dict[str, Any]]) -> None:
    names = {name for _, name, _ in _blocks(parsed, "variable", MODULES / "stasis")}
    assert "chat_min_instances" in names
    fn = _resource(parsed, "functions", "google_cloudfunctions2_function", "this")
    assert "var.min_instances" in fn["service_config"][0]["min_instance_count"]


def test_scheduled_functions_get_oidc_jobs(parsed: dict[Path, dict[str, Any]]) -> None:
    job = _resource(parsed, "scheduler", "google_cloud_scheduler_job", "this")
    assert job["for_each"] == "${var.jobs}"
    assert (
        job["http_target"][0]["oidc_token"][0]["service_account_email"] == "${var.service_account}"
    )


# --- Firestore -----------------------------------------------------------------------------------
def test_the_indexes_are_those_of_the_declared_queries(
    tfvars: dict[str, Any], parsed: dict[Path, dict[str, Any]], queries: list[IndexedQuery]
) -> None:
    assert len(queries) > 10  # the dashboard's and the fleet store's
    assert tfvars["firestore_indexes"] == indexes.composite_indexes(queries)
    found = {(i["collection"], tuple(i["fields"])) for i in tfvars["firestore_indexes"]}
    assert len(found) == len(tfvars["firestore_indexes"]), "duplicates"
    for _, fields in found:
        assert len(fields) >= 2 and all(re.fullmatch(r"[a-z_]+(:desc)?", f) for f in fields)
    # ...and Terraform creates exactly those: environment -> stasis -> firestore.
    index = _resource(parsed, "firestore", "google_firestore_index", "composite")
    assert "var.composite_indexes" in index["for_each"]
    stasis = next(body for _, name, body in _blocks(parsed, "module", MODULES / "stasis")
                  if name == "firestore")
    assert stasis["composite_indexes"] == "${var.firestore_indexes}"
    assert "composite_indexes" not in _locals(parsed, MODULES / "firestore" / "indexes.tf")


def test_ttl_policies(
    parsed: dict[Path, dict[str, Any]], queries: list[IndexedQuery]
) -> None:
    ttl = _locals(parsed, MODULES / "firestore" / "indexes.tf")["ttl_fields"]
    pairs = {(v["collection"], v["field"]) for v in ttl.values()}
    assert {
        ("processed", "expire_at"),
        ("deliveries", "expire_at"),
        ("snapshots", "expires_at"),
    } <= pairs
    code = "".join(p.read_text() for p in (ROOT / "functions").rglob("*.py"))
    for collection, field in pairs:
        assert f'"{field}"' in code, f"no code writes {collection}.{field}"
    # A TTL field stripped of its indexes must not be queried.
    for v in ttl.values():
        if v["index"] is False:
            used = [
                q
                for q in queries
                if q.collection == v["collection"]
                and v["field"] in (*q.equal, *q.optional, *q.ranges, *(n for n, _ in q.order))
            ]
            assert not used, f"{v['collection']}.{v['field']} is queried by {used}"
    field = _resource(parsed, "firestore", "google_firestore_field", "ttl")
    assert field["ttl_config"] == [{}] or field["ttl_config"]


# --- secrets -------------------------------------------------------------------------------------
def _secret_reads() -> dict[str, str]:
    """Secret-looking variables the deployed code (functions/, events/) and the settings
    read -> where."""
    found: dict[str, str] = {}
    files = [p for d in ("functions", "events") for p in (ROOT / d).rglob("*.py")]
    for path in [*files, ROOT / "stack" / "settings.py"]:
        for match in ENV_READ.finditer(path.read_text()):
            if SECRET_NAME.search(match.group(1)):
                found.setdefault(match.group(1), str(path.relative_to(ROOT)))
    return found


def test_every_secret_the_settings_read_is_declared(parsed: dict[Path, dict[str, Any]]) -> None:
    declared = next(
        body
        for _, name, body in _blocks(parsed, "variable", MODULES / "stasis")
        if name == "secrets"
    )["default"]
    reads = _secret_reads()
    missing = {name: where for name, where in reads.items() if name not in declared}
    assert not missing, f'declare these in modules/stasis variable "secrets": {missing}'
    for name, spec in declared.items():
        assert re.fullmatch(r"[a-z][a-z0-9-]+", spec["secret_id"]), name
        assert spec["consumers"], name
    fn = (MODULES / "functions" / "main.tf").read_text()
    assert "secret_environment_variables" in fn and 'version    = "latest"' in fn


def test_the_secret_scan_sees_environment_reads() -> None:
    text = (
        'x = os.environ.get("STASIS_SLACK_BOT_TOKEN")\ny = environ["MY_API_KEY"]\n'
        'z = env("STASIS_K8S_HOST")\n'
    )
    names = {m.group(1) for m in ENV_READ.finditer(text)}
    assert names == {"STASIS_SLACK_BOT_TOKEN", "MY_API_KEY", "STASIS_K8S_HOST"}
    assert {n for n in names if SECRET_NAME.search(n)} == {"STASIS_SLACK_BOT_TOKEN", "MY_API_KEY"}


# --- storage, IAP, GKE ---------------------------------------------------------------------------
def test_snapshot_bucket_is_hardened(parsed: dict[Path, dict[str, Any]]) -> None:
    bucket = _resource(parsed, "storage", "google_storage_bucket", "snapshots")
    assert bucket["location"] == "${var.snapshot_location}"
    assert bucket["uniform_bucket_level_access"] is True
    assert bucket["public_access_prevention"] == "enforced"
    assert bucket["encryption"][0]["default_kms_key_name"] == "${var.snapshot_kms_key}"
    assert bucket["soft_delete_policy"][0]["retention_duration_seconds"]
    actions = {r["action"][0]["type"] for r in bucket["lifecycle_rule"]}
    assert actions == {"Delete", "AbortIncompleteMultipartUpload"}
    key = _resource(parsed, "kms", "google_kms_crypto_key", "this")
    assert key["rotation_period"] == "${var.rotation_period}"
    source = _resource(parsed, "storage", "google_storage_bucket", "source")
    assert source["uniform_bucket_level_access"] is True


def test_iap_fronts_the_iap_functions(
    parsed: dict[Path, dict[str, Any]], tfvars: dict[str, Any]
) -> None:
    backend = _resource(parsed, "iap", "google_compute_backend_service", "this")
    assert backend["iap"][0]["enabled"] is True
    neg = _resource(parsed, "iap", "google_compute_region_network_endpoint_group", "this")
    assert neg["network_endpoint_type"] == "SERVERLESS"
    iap = {n for n, f in tfvars["http_functions"].items() if f["access"] == "iap"}
    assert {"dashboard", "proxy"} <= iap


def test_node_pools_cover_the_example_profiles(parsed: dict[Path, dict[str, Any]]) -> None:
    import yaml

    profiles = yaml.safe_load((ROOT / "examples" / "stasis.yaml").read_text())["profiles"]
    for env in ENVIRONMENTS:
        module = next(body for _, name, body in _blocks(parsed, "module", env) if name == "stasis")
        pools = module["node_pools"]
        assert any(not p.get("spot") and not p.get("accelerator_type") for p in pools.values())
        assert any(p.get("spot") for p in pools.values())
        for profile in profiles:
            accel = (profile.get("accelerator") or {}).get("type")
            if accel and accel.startswith("nvidia"):
                spot = profile["provisioning"] == "spot"
                match = [
                    p
                    for p in pools.values()
                    if p.get("accelerator_type") == accel and bool(p.get("spot")) == spot
                ]
                assert match, f"{env.name}: no pool for {profile['id']}"
                if profile["snapshot"]["method"] == "pod":
                    assert all(p.get("sandbox") for p in match), "Pod Snapshots need gVisor"


# --- the cluster's objects -----------------------------------------------------------------------
def test_kubernetes_objects_come_from_the_builders(tfvars: dict[str, Any]) -> None:
    k8s = tfvars["kubernetes"]
    objects = {
        key: json.loads(text) for tier in k8s["manifests"].values() for key, text in tier.items()
    }
    kinds = {o["kind"] for o in objects.values()}
    assert {
        "ClusterRole",
        "ClusterRoleBinding",
        "Deployment",
        "Namespace",
        "PodSnapshotStorageConfig",
        "PodSnapshotPolicy",
        "StorageClass",
    } <= kinds
    for team, info in k8s["teams"].items():
        configs = [
            o
            for o in objects.values()
            if o["kind"] == "PodSnapshotStorageConfig"
            and o["metadata"]["annotations"].get("stasis.dev/team-id", team) == team
            and o["spec"]["snapshotStorageConfig"]["gcs"]["path"].startswith(
                info["snapshot_prefix"]
            )
        ]
        assert configs, f"no Pod Snapshots storage configuration for {team}"
        assert configs[0]["spec"]["snapshotStorageConfig"]["gcs"]["bucket"] == "@@BUCKET@@"
    # RBAC: verb-minimal, no wildcard, every binding's subjects filled in by Terraform.
    for o in objects.values():
        for rule in o.get("rules", []):
            assert "*" not in rule["verbs"] + rule["resources"] + rule["apiGroups"], o
        if o["kind"] in ("ClusterRoleBinding", "RoleBinding") and o["metadata"]["name"].startswith(
            "stasis-control-plane"
        ):
            assert o["subjects"] == [cluster.SUBJECTS]
    monitor = next(o for o in objects.values() if o["kind"] == "Deployment")
    assert monitor["spec"]["template"]["spec"]["containers"][0]["image"] == "@@AGENT_IMAGE@@"


def test_every_placeholder_is_filled_by_terraform(tfvars: dict[str, Any]) -> None:
    text = json.dumps(tfvars["kubernetes"]["manifests"])
    used = set(re.findall(r"@@[A-Z_]+@@", text))
    assert used <= {*cluster.PLACEHOLDERS, cluster.SUBJECTS, cluster.READERS}
    module = (MODULES / "kubernetes" / "main.tf").read_text()
    stasis = (MODULES / "stasis" / "main.tf").read_text()
    for placeholder in cluster.PLACEHOLDERS:
        assert f'"{placeholder}"' in module and f'"{placeholder}"' in stasis, placeholder
    assert cluster.SUBJECTS in module and cluster.READERS in module
    assert "reader_members        = [for n in local.cluster_readers :" in stasis


# --- monitoring triggers (modules/monitoring) ----------------------------------------------
def test_the_bundle_gives_the_monitoring_topic_and_the_gpu_idle_alert(
    tfvars: dict[str, Any],
) -> None:
    catalog = Catalog.from_config(yaml.safe_load((ROOT / "examples" / "stasis.yaml").read_text()))
    gpu_windows = [rule.idle_seconds for p in catalog.profiles.values()
                   if p.accelerator and p.accelerator.type.startswith("nvidia")
                   for rule in p.idle_policy.rules if rule.effect.value == "pause"]
    assert tfvars["monitoring"] == {"topic": TOPIC,
                                    "gpu_idle_percent": GPU_BUSY_PERCENT,
                                    "gpu_idle_window_seconds": min(gpu_windows)}
    raw = tfvars["event_functions"]["on_monitoring"]
    assert (raw["kind"], raw["access"], raw["event"], raw["topic"]) == (
        "cloudevent", "event", None, TOPIC)
    assert raw["dead_letter_topic"] == dead_letter_topic("on_monitoring")
    assert tfvars["http_functions"]["alertmanager"]["access"] == "public"


def test_the_raw_route_gets_its_topic_and_no_eventarc_trigger(
    parsed: dict[Path, dict[str, Any]],
) -> None:
    stasis = (MODULES / "stasis" / "main.tf").read_text()
    assert "raw_topics            = distinct([for f in var.event_functions : f.topic if " \
        "f.event == null])" in stasis
    raw = _resource(parsed, "pubsub", "google_pubsub_topic", "raw")
    assert raw["kms_key_name"] == "${var.kms_key}"
    functions = _locals(parsed, MODULES / "functions" / "main.tf")
    assert "f.event != null" in functions["event_functions"]  # Eventarc: events only
    wiring = next(body for _, name, body in _blocks(parsed, "module", MODULES / "stasis")
                  if name == "monitoring")
    assert wiring["topic_id"] == "${module.pubsub.raw_topic_ids[var.monitoring.topic]}"
    assert "alertmanager" in json.dumps(wiring["publishers"])


def test_alert_policies_notify_the_channel_with_their_signal_label(
    parsed: dict[Path, dict[str, Any]],
) -> None:
    channel = _resource(parsed, "monitoring", "google_monitoring_notification_channel",
                        "pubsub")
    assert channel["type"] == "pubsub" and channel["labels"] == {"topic": "${var.topic_id}"}
    policies = {name: _resource(parsed, "monitoring", "google_monitoring_alert_policy", name)
                for name in ("gpu_idle", "gpu_memory", "oom_killed")}
    signals = set()
    for name, policy in policies.items():
        assert policy["notification_channels"] == [
            "${google_monitoring_notification_channel.pubsub.id}"], name
        label = re.search(r'stasis_signal = "(\w+)"', policy["user_labels"])
        assert label, name
        signals.add(label.group(1))
        assert policy["alert_strategy"][0]["auto_close"], name
    assert signals == set(ALERT_KINDS)
    # Workspace containers, by the labels the builders put on the pod.
    main = (MODULES / "monitoring" / "main.tf").read_text()
    for label, value in ((meta.MANAGED_BY, meta.STASIS), (meta.COMPONENT, "workspace")):
        assert f'metadata.user_labels.\\"{label}\\" = \\"{value}\\"' in main
    idle = policies["gpu_idle"]["conditions"][0]["condition_threshold"][0]
    assert "kubernetes.io/container/accelerator/duty_cycle" in idle["filter"]
    assert idle["comparison"] == "COMPARISON_LT"
    assert idle["threshold_value"] == "${var.monitoring.gpu_idle_percent}"
    assert idle["duration"] == "${each.value}s"
    assert policies["gpu_idle"]["for_each"] == "${local.gpu_idle}"  # none without GPUs
    memory = policies["gpu_memory"]["conditions"][0]["condition_threshold"][0]
    assert "accelerator/memory_used" in memory["filter"]
    assert "accelerator/memory_total" in memory["denominator_filter"]
    oom = policies["oom_killed"]["conditions"][0]["condition_prometheus_query_language"][0]
    assert "last_terminated_reason{reason=" in oom["query"] and "OOMKilled" in oom["query"]
    gke = (MODULES / "gke" / "main.tf").read_text()
    assert '"POD"' in gke  # kube-state-metrics' pod metrics, which the OOM query reads


def test_the_log_sink_routes_preemptions_and_node_deletions_to_the_topic(
    parsed: dict[Path, dict[str, Any]],
) -> None:
    sink = _resource(parsed, "monitoring", "google_logging_project_sink", "nodes")
    assert sink["destination"] == "pubsub.googleapis.com/${var.topic_id}"
    assert sink["unique_writer_identity"] is True
    for method in (PREEMPTED_METHOD, NODE_DELETED_METHOD):
        assert f'protoPayload.methodName="{method}"' in sink["filter"]
    assert "cloudaudit.googleapis.com/system_event" in sink["filter"]
    assert 'resource.labels.cluster_name="${var.cluster_name}"' in sink["filter"]
    # Who may publish: the notification agent, the sink's writer, the webhook relay.
    iam = _resource(parsed, "monitoring", "google_pubsub_topic_iam_binding", "publishers")
    members = json.dumps(iam["members"])
    assert "local.notification_agent" in members and "writer_identity" in members
    assert "var.publishers" in members and iam["role"] == "roles/pubsub.publisher"
    agent = _locals(parsed, MODULES / "monitoring" / "main.tf")["notification_agent"]
    assert agent.endswith("@gcp-sa-monitoring-notification.iam.gserviceaccount.com")
