"""Sandboxes reach users, for real: a signed ``/ws sandbox`` and an agent's link each get a
patch back from a real sandbox.

Real parts: the Firestore emulator (sandbox handler transactions, chat records, links and
the handler's ledger the proxy reads), fake-gcs-server (patches and logs), the node agent's
sandbox endpoints on a loopback HTTP server with the real runner (git working copy,
trampoline, monitor), the Slack sink for the notification, and the proxy and link issuer
served on loopback. The bus delivers each event to its consumers on a thread of its own,
as Pub/Sub push would (sandbox.requested -> the handler; sandbox.finished -> the handler
and the chat notifier), so the front doors see the handler's answers as they would.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import tempfile
import threading
import time
import urllib.parse
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest
import requests
import yaml
from flask import Flask
from google.auth.credentials import AnonymousCredentials
from google.cloud import firestore, storage
from werkzeug.middleware.dispatcher import DispatcherMiddleware
from werkzeug.serving import WSGIRequestHandler, make_server
from werkzeug.wrappers import Response

from events import Event
from functions.adapters.chat_store import ChatStore
from functions.adapters.firestore_store import FirestoreStore
from functions.adapters.iap import DevIdentity
from functions.adapters.link_store import FirestoreLinkStore
from functions.adapters.sandbox_results import FirestoreSandboxResults
from functions.adapters.sandbox_runtime import LocalSandboxRuntime
from functions.adapters.sandbox_store import FirestoreSandboxStore
from functions.adapters.slack import ChatFunction, SlackNotifier, SlackSettings
from functions.chatops import notify, signing
from functions.chatops.ports import ChatDeps
from functions.chatops.service import answer, sandbox_id_for
from functions.domain.catalog import Catalog
from functions.handlers import sandboxes as handler
from functions.handlers.deps import Deps
from functions.handlers.sandbox_ports import SandboxDeps
from functions.proxy.access import AccessProxy, wsgi
from functions.proxy.issuer import LinkIssuer
from runtime.local.publisher import RecordingPublisher
from runtime.local.sandboxes import SandboxRunner, register_sandboxes
from runtime.local.settings import AgentSettings
from runtime.supervisor import free_port
from stack import slack_sink

ROOT = Path(__file__).resolve().parents[2]
SECRET, TOKEN = "front-door-secret", "xoxb-front-door"
WS = "ml-a--nb"
FIX = "sed -i 's/a - b/a + b/' calc.py"
ENDED = ("SUCCEEDED", "FAILED", "TIMED_OUT", "KILLED")


def git(repo: Path, *args: str) -> str:
    return subprocess.run(["git", "-C", str(repo), *args], check=True, capture_output=True,
                          text=True).stdout


def passes(repo: Path) -> bool:
    return subprocess.run(["python", "-m", "unittest", "-q", "test_calc"], cwd=repo,
                          capture_output=True).returncode == 0


@pytest.fixture
def repo(tmp_path: Path) -> Path:
    """A repository whose one test fails: add() subtracts."""
    path = tmp_path / "calc"
    path.mkdir()
    git(path, "init", "-q", "-b", "main")
    (path / "calc.py").write_text("def add(a, b):\n    return a - b\n")
    (path / "test_calc.py").write_text(
        "import unittest\nfrom calc import add\n\n\nclass T(unittest.TestCase):\n"
        "    def test_add(self):\n        self.assertEqual(add(2, 3), 5)\n")
    (path / ".gitignore").write_text("__pycache__/\n")
    git(path, "add", "-A")
    git(path, "-c", "user.email=t@t", "-c", "user.name=t", "commit", "-qm", "add() with a bug")
    assert not passes(path)
    return path


def applies_and_passes(repo: Path, patch: str, tmp: Path) -> bool:
    clone = tmp / "review"
    subprocess.run(["git", "clone", "-q", str(repo), str(clone)], check=True)
    (tmp / "fix.patch").write_text(patch)
    git(clone, "apply", "--binary", str(tmp / "fix.patch"))
    return passes(clone)


class _Push(RecordingPublisher):
    """Every consumer of an event gets it on a thread of its own, as push would."""

    def __init__(self) -> None:
        super().__init__()
        self.deps: Deps | None = None
        self.errors: list[BaseException] = []
        self.notified: list[Any] = []

    def publish(self, event: Event[Any]) -> str:
        super().publish(event)
        consumers: list[tuple[Any, str]] = {
            "sandbox.requested": [(handler.handle, "on_sandbox_requested")],
            "sandbox.finished": [(handler.handle, "on_sandbox_finished")],
            "sandbox.state_changed": [(self._notify, "notify_chat_sandbox")],
            "sandbox.suspended": [(handler.handle, "on_sandbox_suspended")],
            "sandbox.resume_requested": [(handler.handle, "on_sandbox_resume_requested")],
        }.get(event.name, [])
        for consume, consumer in consumers:
            threading.Thread(target=self._deliver, args=(consume, event, consumer),
                             daemon=True).start()
        return event.id

    def _notify(self, event: Event[Any], deps: Deps, consumer: str) -> None:
        told = notify.handle_sandbox(event, deps, consumer)
        if told is not None:  # None: a change nobody is told about (not an end)
            self.notified.append(told)

    def _deliver(self, consume: Any, event: Event[Any], consumer: str) -> None:
        try:
            assert self.deps is not None
            consume(event, self.deps, consumer)
        except BaseException as exc:
            self.errors.append(exc)


class _Quiet(WSGIRequestHandler):
    def log_request(self, *args: Any, **kwargs: Any) -> None:
        pass


@dataclass
class Plane:
    db: firestore.Client
    bus: _Push
    deps: Deps
    runner: SandboxRunner
    url: str  # the function host: /proxy and /links
    sink: str

    def doc(self, sandbox_id: str) -> dict[str, Any]:
        return self.db.collection("sandboxes").document(sandbox_id).get().to_dict() or {}

    def wait(self, sandbox_id: str, timeout: float = 120) -> dict[str, Any]:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            doc = self.doc(sandbox_id)
            if doc.get("state") in ENDED:
                return doc
            assert not self.bus.errors, self.bus.errors
            time.sleep(0.2)
        raise AssertionError(f"{sandbox_id} did not end: {self.doc(sandbox_id)}")


def _serve(app: Any) -> tuple[Any, str]:
    server = make_server("127.0.0.1", 0, app, threaded=True, request_handler=_Quiet)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server, f"http://127.0.0.1:{server.server_port}"


@pytest.fixture
def plane(emulator_env: dict[str, str], gcs_emulator: Any, tmp_path: Path) -> Iterator[Plane]:
    project = emulator_env["STASIS_PROJECT"]
    bucket = emulator_env["STASIS_SNAPSHOT_BUCKET"]
    gcs = storage.Client(project=project, credentials=AnonymousCredentials(),
                         client_options={"api_endpoint": gcs_emulator.url})
    gcs.create_bucket(bucket)
    config = yaml.safe_load((ROOT / "examples" / "stasis.yaml").read_text())
    catalog = Catalog.from_config(config)
    db = firestore.Client(project=project)
    # One slot for team ml-a: the second request queues.
    db.collection("catalog").document("current").set(
        {**config, "sandboxes": {"concurrency": 1, "defaults": {"wall_clock_seconds": 120}}})
    db.collection("teams").document("ml-a").set({"id": "ml-a", "members": [
        {"user": "alice", "role": "admin"}, {"user": "bob", "role": "member"}]})
    db.collection("workspaces").document(WS).set({
        "id": WS, "team": "ml-a", "owner": "bob", "name": "nb", "state": "PAUSED",
        "version": 4, "profile": "cpu-small"})

    sink_server = slack_sink.serve(0, TOKEN)
    threading.Thread(target=sink_server.serve_forever, daemon=True).start()
    sink = f"http://127.0.0.1:{sink_server.server_address[1]}"

    bus = _Push()
    root = Path(tempfile.mkdtemp(prefix="stasis-test-front-doors-"))
    settings = AgentSettings(data_dir=tmp_path / "data", project=project, port=free_port())
    runner = SandboxRunner(settings, bus, root=root, environ=dict(os.environ))
    agent = Flask("agent")
    register_sandboxes(agent, settings, bus)
    agent.config["sandboxes"] = lambda: runner
    agent_server = make_server("127.0.0.1", settings.port, agent, threaded=True,
                               request_handler=_Quiet)
    threading.Thread(target=agent_server.serve_forever, daemon=True).start()

    store = ChatStore(db)
    chat = ChatDeps(reads=store, records=store,
                    notifier=SlackNotifier(SlackSettings(SECRET, TOKEN, f"{sink}/api/")),
                    bus=bus, catalog=lambda: catalog, clock=lambda: datetime.now(UTC))
    deps = Deps(store=FirestoreStore(db), bus=bus, runtime=None,  # type: ignore[arg-type]
                snapshots=None, catalog=lambda: catalog,  # type: ignore[arg-type]
                clock=lambda: datetime.now(UTC), snapshot_bucket=bucket,
                dead_letters=None,  # type: ignore[arg-type]
                chat=chat,
                sandboxes=SandboxDeps(FirestoreSandboxStore(db),
                                      LocalSandboxRuntime(settings.url,
                                                          token=settings.control_token())))
    bus.deps = deps

    links = FirestoreLinkStore(db)
    holder: dict[str, str] = {}
    issuer = LinkIssuer(links, bus, DevIdentity(), clock=lambda: datetime.now(UTC),
                        proxy_url=lambda request: holder["url"] + "/proxy")
    proxy = AccessProxy(links, None, bus, DevIdentity(),  # type: ignore[arg-type]
                        clock=lambda: datetime.now(UTC), on_exposed=issuer.revoke_exposed,
                        sandboxes=FirestoreSandboxResults(db, lambda: gcs))
    issuer.revoked_listeners.append(proxy.auth.forget)
    chat_app = ChatFunction(SlackSettings(SECRET, TOKEN, f"{sink}/api/", team_id="T0"),
                            lambda req: answer(req, chat))

    def slash(environ: dict[str, Any], start_response: Any) -> Any:
        body = environ["wsgi.input"].read(int(environ.get("CONTENT_LENGTH") or 0)).decode()
        headers = {k[5:].replace("_", "-").title(): v for k, v in environ.items()
                   if k.startswith("HTTP_")}
        headers["Content-Type"] = environ.get("CONTENT_TYPE", "")
        answered = chat_app.dispatch(body, headers)
        return Response(answered.body, status=answered.status,
                        content_type="application/json")(environ, start_response)

    host, url = _serve(DispatcherMiddleware(Response("no", 404), {
        "/proxy": wsgi(proxy), "/links": wsgi(issuer), "/chat": slash}))
    holder["url"] = url
    try:
        yield Plane(db, bus, deps, runner, url, sink)
    finally:
        runner.wait_idle(60)
        proxy.close()
        for server in (host, agent_server, sink_server):
            server.shutdown()
        shutil.rmtree(root, ignore_errors=True)


# -- an agent through its link ---------------------------------------------------------------------

def _link(plane: Plane, scope: str) -> dict[str, Any]:
    response = requests.post(f"{plane.url}/links/", json={"workspace_id": WS, "scope": scope},
                             headers={"X-Stasis-User": "bob"}, timeout=30)
    assert response.status_code == 201, response.text
    return dict(response.json())


def _agent(plane: Plane, token: str, method: str, path: str = "", **kwargs: Any) -> Any:
    return requests.request(method, f"{plane.url}/proxy/{WS}/stasis/sandboxes{path}",
                            headers={"Authorization": f"Bearer {token}"}, timeout=60, **kwargs)


def test_an_agent_hands_tasks_to_sandboxes_through_its_link_and_gets_a_patch_that_works(
        plane: Plane, repo: Path, tmp_path: Path) -> None:
    link = _link(plane, "sandbox")
    token = link["token"]
    task = {"repository": str(repo), "base_ref": "main", "command": FIX}
    first = _agent(plane, token, "POST", json=task)
    assert first.status_code == 201, first.text
    body = first.json()
    # The workspace is PAUSED: a sandbox runs beside it, so it is neither resumed nor waited on.
    assert body["state"] == "RUNNING" and body["sandbox_id"].startswith("sbx-")
    second = _agent(plane, token, "POST", json={**task, "command": "sleep 1; echo 2 > two.txt",
                                                "sandbox_id": "sbx-agent-two"})
    assert second.status_code == 201, second.text
    assert (second.json()["state"], second.json()["queue_position"]) == ("QUEUED", 1)
    assert "position 1 of 1" in second.json()["message"]

    sandbox_id = body["sandbox_id"]
    doc = plane.doc(sandbox_id)
    assert (doc["requester"], doc["team"], doc["reply_to"]) == ("bob", "ml-a", None)
    plane.wait(sandbox_id)
    view = _agent(plane, token, "GET", f"/{sandbox_id}").json()
    assert (view["state"], view["exit_status"], view["files_changed"]) == (
        "SUCCEEDED", 0, ["calc.py"])
    assert "stasis sandbox apply" in view["review"] and not view["patch_truncated"]
    assert applies_and_passes(repo, view["patch"], tmp_path)
    raw = _agent(plane, token, "GET", f"/{sandbox_id}/patch")
    assert raw.headers["Content-Type"].startswith("text/x-diff") and raw.text == view["patch"]
    listed = [r["id"] for r in _agent(plane, token, "GET").json()["sandboxes"]]
    assert sorted(listed) == sorted([sandbox_id, "sbx-agent-two"])
    assert plane.wait("sbx-agent-two")["files_changed"] == ["two.txt"]  # ran after a slot freed
    assert plane.db.collection("workspaces").document(WS).get().to_dict()["state"] == "PAUSED"

    revoked = requests.delete(f"{plane.url}/links/{link['link_id']}",
                              headers={"X-Stasis-User": "bob"}, timeout=30)
    assert revoked.status_code == 200
    assert _agent(plane, token, "GET", f"/{sandbox_id}").status_code == 401
    assert _agent(plane, token, "POST", json=task).status_code == 401
    audit = [a.to_dict() for a in plane.db.collection("audit").stream()]
    assert sum(1 for a in audit if a.get("action") == "link.sandbox") == 2


def test_a_read_link_cannot_spend_the_teams_compute_and_limits_are_refused_with_the_reason(
        plane: Plane, repo: Path) -> None:
    read = _link(plane, "read")["token"]
    task = {"repository": str(repo), "command": FIX}
    refused = _agent(plane, read, "POST", json=task)
    assert refused.status_code == 403 and refused.json()["error"] == "insufficient_scope"
    exec_token = _link(plane, "exec")["token"]
    too_big = _agent(plane, exec_token, "POST", json={**task, "limits": {"memory": "64Gi"}})
    assert too_big.status_code == 400, too_big.text
    assert "memory 64Gi > 8Gi" in too_big.json()["message"]
    assert plane.runner.list() == []


# -- a signed /ws sandbox ------------------------------------------------------------------

def _slash(plane: Plane, text: str, trigger: str) -> tuple[str, str]:
    body = urllib.parse.urlencode({
        "command": "/ws", "text": text, "user_id": "U0ALICE", "team_id": "T0",
        "channel_id": "C0", "response_url": f"{plane.sink}/response/r-{trigger}",
        "trigger_id": trigger})
    response = requests.post(f"{plane.url}/chat/", data=body, timeout=30, headers={
        **signing.signed_headers(SECRET, int(time.time()), body),
        "Content-Type": "application/x-www-form-urlencoded"})
    assert response.status_code == 200, response.text
    return str(response.json()["text"]), signing.request_id(trigger, body)


def test_a_signed_ws_sandbox_is_acked_then_the_requester_is_told_with_the_patch(
        plane: Plane, repo: Path, tmp_path: Path) -> None:
    text, requestid = _slash(plane, f"sandbox {repo} --ref main --wall-clock 2m -- {FIX}",
                             "9.1.sbx")
    sandbox_id = sandbox_id_for(requestid)
    assert f"Sandbox `{sandbox_id}` is running `{FIX}` on {repo}@main" in text
    assert f"`{requestid}`" in text
    doc = plane.wait(sandbox_id)
    assert (doc["requester"], doc["limits"]["wall_clock_seconds"]) == ("alice", 120)
    deadline = time.monotonic() + 30
    while not (notes := requests.get(f"{plane.sink}/messages",
                                     params={"requestid": requestid}, timeout=10
                                     ).json()["messages"]) and time.monotonic() < deadline:
        time.sleep(0.2)
    [note] = notes
    assert note["text"].startswith(f"Sandbox `{sandbox_id}` (`{FIX}`) ended *SUCCEEDED*")
    assert doc["patch_uri"] in note["text"] and f"stasis sandbox apply {sandbox_id}" in note["text"]
    assert note["response_id"] == "r-9.1.sbx"  # through the command's response_url
    assert plane.bus.notified == ["response_url"]
    patch = plane.deps.sandboxes.store.get(sandbox_id).patch_uri
    blob = patch.removeprefix("gs://").partition("/")
    data = storage.Client(project=plane.db.project, credentials=AnonymousCredentials(),
                          client_options={"api_endpoint": os.environ["STORAGE_EMULATOR_HOST"]}
                          ).bucket(blob[0]).blob(blob[2]).download_as_bytes()
    assert applies_and_passes(repo, data.decode(), tmp_path)

    shown, _ = _slash(plane, f"sandbox show {sandbox_id}", "9.2.sbx")
    assert "*SUCCEEDED*" in shown and "1 file changed" in shown and "`calc.py`" in shown
    listed, _ = _slash(plane, "sandbox list", "9.3.sbx")
    assert f"`{sandbox_id}`  SUCCEEDED  (alice)" in listed


def test_invalid_ws_sandbox_input_is_answered_with_the_usage_and_requests_nothing(
        plane: Plane, repo: Path) -> None:
    text, _ = _slash(plane, f"sandbox {repo} {FIX}", "9.4.sbx")
    assert "put the command after a standalone `--`" in text
    assert "Usage: `/ws sandbox REPOSITORY" in text
    text, _ = _slash(plane, f"sandbox {repo} --memory lots -- true", "9.5.sbx")
    assert "memory takes a size like 2Gi" in text
    assert [e for e in plane.bus.events if e.name == "sandbox.requested"] == []
    assert json.loads(requests.get(f"{plane.sink}/messages", timeout=10).text)["messages"] == []


# -- the reconciler frees the slot of a sandbox whose runtime went silent --------------------------

class _NothingRuns:
    def list(self) -> list[Any]:
        return []


def test_a_silent_running_sandbox_is_ended_runtime_lost_and_the_queue_moves_on(
        plane: Plane, repo: Path) -> None:
    from dataclasses import replace
    from datetime import timedelta

    from functions.domain.sandboxes import Limits, Sandbox, SandboxState
    from functions.handlers.reconciler import reconcile

    # A sandbox the runtime lost two hours ago holds team ml-a's only slot; one waits.
    now = datetime.now(UTC)
    lost = Sandbox(id="sbx-lost", team="ml-a", requester="alice", repository=str(repo),
                   command="true", base_ref="main", limits=Limits(60, 2**30, 60, 64),
                   allowed_network=(), state=SandboxState.RUNNING, reason="admitted",
                   requestid="slack-lost", requested_at=now - timedelta(hours=2),
                   started_at=now - timedelta(hours=2), version=2,
                   reply_to='slack:{"user":"U0ALICE"}')
    waiting = replace(lost, id="sbx-waiting", state=SandboxState.QUEUED, reason="queued",
                      requestid="cli-waiting", started_at=None, queue_position=1, version=1,
                      reply_to=None, command="echo w > w.txt")
    for sandbox in (lost, waiting):
        plane.db.collection("sandboxes").document(sandbox.id).set(sandbox.to_doc())
    plane.db.collection("sandbox_queues").document("ml-a").set(
        {"running": ["sbx-lost"], "queued": ["sbx-waiting"]})
    deps = replace(plane.deps, runtime=_NothingRuns())

    planned = reconcile(deps, fix=False)
    assert [r.sandbox_id for r in planned.sandboxes] == ["sbx-lost"]
    reconcile(deps)
    reconcile(deps)  # a second run before the first landed: the same event id, one effect
    ended = plane.wait("sbx-lost", timeout=30)
    assert (ended["state"], ended["reason"], ended["termination"]) == (
        "FAILED", "runtime_lost", "runtime_lost")
    assert "past its wall clock of 60s" in ended["error"] and ended["version"] == 3
    promoted = plane.wait("sbx-waiting")
    assert (promoted["state"], promoted["files_changed"]) == ("SUCCEEDED", ["w.txt"])
    # The requester of the lost one was told (a DM: there was no chat record any more).
    deadline = time.monotonic() + 20
    while "chat.postMessage" not in plane.bus.notified and time.monotonic() < deadline:
        time.sleep(0.1)
    messages = requests.get(f"{plane.sink}/messages", timeout=10).json()["messages"]
    assert [m["text"] for m in messages if "sbx-lost" in m["text"]] == [
        m["text"] for m in messages][:1]
    assert "ended *FAILED*: lost: the runtime stopped reporting" in messages[0]["text"]
    assert plane.bus.notified.count("chat.postMessage") == 1


def test_stasis_link_sandbox_needs_nothing_but_the_link(plane: Plane, repo: Path,
                                                       tmp_path: Path) -> None:
    from click.testing import CliRunner

    from stasis_cli.main import main

    link = _link(plane, "sandbox")
    runner = CliRunner()
    env = {"STASIS_LINK": link["url"], "STASIS_IAP_TOKEN": ""}
    done = runner.invoke(main, ["link", "sandbox", "--repo", str(repo), "--base", "main",
                                "--command", FIX, "--wait", "--id", "sbx-cli-agent"], env=env)
    assert done.exit_code == 0, done.output
    assert "sbx-cli-agent: RUNNING" in done.stderr and "SUCCEEDED" in done.stderr
    assert applies_and_passes(repo, done.stdout, tmp_path)
    again = runner.invoke(main, ["link", "sandbox", "--repo", str(repo), "--command", FIX,
                                 "--id", "sbx-cli-agent"], env=env)
    assert again.exit_code == 0 and again.stdout.strip() == "sbx-cli-agent"  # one request
    refused = runner.invoke(main, ["link", "sandbox", "--repo", str(repo), "--command", FIX,
                                   "--memory", "64Gi"], env=env)
    assert refused.exit_code == 3 and "memory 64Gi > 8Gi" in refused.stderr
    requests.delete(f"{plane.url}/links/{link['link_id']}", headers={"X-Stasis-User": "bob"},
                    timeout=30)
    revoked = runner.invoke(main, ["link", "sandbox", "--repo", str(repo), "--command", FIX],
                            env=env)
    assert revoked.exit_code == 3 and "revoked" in revoked.stderr


def test_an_agent_resumes_its_idle_suspended_sandbox_through_the_link(
        plane: Plane, repo: Path, tmp_path: Path) -> None:
    token = _link(plane, "sandbox")["token"]
    started = _agent(plane, token, "POST", json={
        "repository": str(repo), "base_ref": "main", "limits": {"idle_seconds": 1},
        "command": f"sleep 4; {FIX}"})
    assert started.status_code == 201, started.text
    sandbox_id = started.json()["sandbox_id"]
    deadline = time.monotonic() + 60
    while (view := _agent(plane, token, "GET", f"/{sandbox_id}").json())["state"] != \
            "SUSPENDED" and time.monotonic() < deadline:
        assert view["state"] == "RUNNING", view
        time.sleep(0.2)
    assert view["state"] == "SUSPENDED", view
    resumed = _agent(plane, token, "POST", f"/{sandbox_id}/resume")
    assert resumed.status_code == 200, resumed.text
    assert resumed.json()["state"] == "RUNNING" and "resumed after" in resumed.json()["message"]
    # The task sleeps, which is no progress: it may be held again; each resume lets the
    # sleep run on (it counts wall time) until the fix is made.
    deadline = time.monotonic() + 60
    while (doc := plane.doc(sandbox_id))["state"] not in ENDED and time.monotonic() < deadline:
        if doc["state"] == "SUSPENDED":
            again = _agent(plane, token, "POST", f"/{sandbox_id}/resume")
            assert again.status_code in (200, 409), again.text  # 409: it moved on meanwhile
        time.sleep(0.2)
    view = _agent(plane, token, "GET", f"/{sandbox_id}").json()
    assert view["state"] == "SUCCEEDED" and applies_and_passes(repo, view["patch"], tmp_path)
