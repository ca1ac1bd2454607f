"""The IDE access proxy against a real jupyter-server and the real emulators.

The proxy (``functions.ideproxy``) is served in-process on a loopback port, with the real
Firestore link store and Pub/Sub bus of a project of its own; the IDE is a real JupyterLab
started by the local runtime's supervisor under its proxy base path (``/w/<id>/``); the
runtime's status (where the server is, its token) is the one thing given directly, as the
node agent would report it. A browser is played by ``requests`` and ``websocket-client``
carrying the portal's session cookie, issued with ``session.issue`` as the portal does.
Whole-stack browser tests (Chromium, pause and resume): tests/e2e/test_ide_proxy_e2e.py.
"""

from __future__ import annotations

import asyncio
import json
import re
import threading
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import requests
import websocket
from aiohttp import web
from google.cloud import firestore, pubsub_v1
from pubsub_support import pull, subscribe

from events import spec_for
from functions.adapters.link_store import FirestoreLinkStore
from functions.adapters.pubsub_bus import PubSubBus
from functions.ideproxy.access import Gate, SessionCookies
from functions.ideproxy.app import IdeProxy, make_app
from functions.portal import session
from functions.ports import RuntimeStatus
from runtime.local import servers
from runtime.local.servers import ServerLaunch, ServerProcess

ROOT = Path(__file__).resolve().parents[2]
WS = "ml-a--ide"
SECRET = b"integration-secret"
MEMBERS = [{"user": "alice", "role": "admin"}, {"user": "bob", "role": "member"},
           {"user": "carl", "role": "member"}]


@pytest.fixture(scope="module")
def lab(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    """A real JupyterLab under /w/ml-a--ide/, as the node agent starts it."""
    tmp = tmp_path_factory.mktemp("lab")
    launch = ServerLaunch(workspace_id=WS, home=tmp / "home", runtime_dir=tmp / "run",
                          log_path=tmp / "lab.log", repo_root=ROOT)
    server = servers.start(launch, timeout=120)
    try:
        yield server
    finally:
        servers.stop(server, grace=5)


class _Served:
    """An aiohttp application on its own event loop and thread."""

    def __init__(self, app: web.Application) -> None:
        self.app = app
        self.loop = asyncio.new_event_loop()
        self.started = threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.url = ""
        self.failed: BaseException | None = None

    def _run(self) -> None:
        asyncio.set_event_loop(self.loop)
        try:
            self.runner = web.AppRunner(self.app)
            self.loop.run_until_complete(self.runner.setup())
            site = web.TCPSite(self.runner, "127.0.0.1", 0)  # a free port, read back
            self.loop.run_until_complete(site.start())
            port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
            self.url = f"http://127.0.0.1:{port}"
        except BaseException as exc:
            self.failed = exc
            raise
        finally:
            self.started.set()
        self.loop.run_forever()

    def __enter__(self) -> _Served:
        self.thread.start()
        assert self.started.wait(30), "the proxy did not start"
        assert self.failed is None, f"the proxy did not start: {self.failed!r}"
        return self

    def __exit__(self, *exc: object) -> None:
        asyncio.run_coroutine_threadsafe(self.runner.cleanup(), self.loop).result(30)
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(30)


@dataclass
class Proxy:
    url: str
    db: firestore.Client
    project: str
    lab: ServerProcess
    resumes: str  # a pull subscription on workspace.resume_requested

    def cookie(self, user: str) -> str:
        return session.issue(user, SECRET, time.time())[1]

    def get(self, path: str, user: str | None = None, **kwargs: Any) -> requests.Response:
        cookies = {session.COOKIE: self.cookie(user)} if user else {}
        return requests.get(self.url + path, cookies=cookies, timeout=60,
                            allow_redirects=False, **kwargs)

    def websocket(self, path: str, user: str | None, **headers: str) -> websocket.WebSocket:
        header = [f"{k}: {v}" for k, v in headers.items()]
        if user:
            header.append(f"Cookie: {session.COOKIE}={self.cookie(user)}")
        return websocket.create_connection(self.url.replace("http", "ws", 1) + path,
                                           header=header, timeout=30,
                                           suppress_origin=True)

    def state(self, state: str, version: int) -> None:
        self.db.collection("workspaces").document(WS).set(
            {"team": "ml-a", "owner": "bob", "state": state, "version": version})


@pytest.fixture
def proxy(emulator_env: dict[str, str], lab: ServerProcess) -> Iterator[Proxy]:
    project = emulator_env["GOOGLE_CLOUD_PROJECT"]
    db = firestore.Client(project=project)
    db.collection("teams").document("ml-a").set({"members": MEMBERS})
    db.collection("teams").document("ml-b").set({"members": [{"user": "carol",
                                                               "role": "admin"}]})
    publisher = pubsub_v1.PublisherClient()
    topic = spec_for("workspace.resume_requested").topic
    publisher.create_topic(name=publisher.topic_path(project, topic))
    resumes = subscribe(project, topic)

    def status(workspace_id: str) -> RuntimeStatus | None:
        if workspace_id != WS:
            return None
        return RuntimeStatus(WS, True, url=lab.url, token=lab.token,
                             detail={"ide": "jupyterlab"})

    app = make_app(IdeProxy(Gate(FirestoreLinkStore(db)), SessionCookies(SECRET), status,
                            PubSubBus(project, origin="ide_proxy"), portal_url="http://127.0.0.1:1/portal/",
                            session_secret=SECRET))
    with _Served(app) as served:
        found = Proxy(served.url, db, project, lab, resumes)
        found.state("RUNNING", 3)
        yield found


def _execute(conn: websocket.WebSocket, code: str) -> str:
    """Run code over a kernel's channels WebSocket; its stdout (JupyterLab's JSON protocol)."""
    msg_id = uuid.uuid4().hex
    conn.send(json.dumps({
        "header": {"msg_id": msg_id, "msg_type": "execute_request", "username": "bob",
                   "session": uuid.uuid4().hex, "version": "5.3"},
        "parent_header": {}, "metadata": {}, "channel": "shell",
        "content": {"code": code, "silent": False, "store_history": True,
                    "user_expressions": {}, "allow_stdin": False, "stop_on_error": True}}))
    out, idle = "", False
    while not idle:
        message = json.loads(conn.recv())
        if message.get("parent_header", {}).get("msg_id") != msg_id:
            continue
        if message["msg_type"] == "stream":
            out += message["content"]["text"]
        elif message["msg_type"] == "error":
            raise AssertionError(message["content"])
        elif message["msg_type"] == "status" and \
                message["content"]["execution_state"] == "idle":
            idle = True
    return out


def _until_closed(conn: websocket.WebSocket) -> tuple[int, str]:
    """Read until the server closes: its close code and reason."""
    conn.settimeout(10)
    while True:
        opcode, frame = conn.recv_data_frame(True)
        if opcode == websocket.ABNF.OPCODE_CLOSE:
            return int.from_bytes(frame.data[:2], "big"), frame.data[2:].decode()


def _kernel(proxy: Proxy, user: str = "bob") -> str:
    created = requests.post(f"{proxy.url}/w/{WS}/api/sessions", timeout=60, json={
        "path": "work.ipynb", "name": "work.ipynb", "type": "notebook",
        "kernel": {"name": "python3"}}, cookies={session.COOKIE: proxy.cookie(user)})
    assert created.status_code == 201, created.text
    return str(created.json()["kernel"]["id"])


def test_jupyterlab_through_the_proxy_and_its_token_never_reaches_the_browser(
        proxy: Proxy) -> None:
    token = proxy.lab.token
    seen: list[str] = []
    root = proxy.get(f"/w/{WS}/", "bob")
    assert root.status_code == 302 and root.headers["Location"].startswith(f"/w/{WS}/lab")
    page = proxy.get(f"/w/{WS}/lab", "bob", headers={"Accept": "text/html"})
    assert page.status_code == 200 and "<title>JupyterLab</title>" in page.text
    # The page embeds the server's token for its own requests: masked, same length.
    config = json.loads(re.search(r'id="jupyter-config-data" type="application/json">'
                                  r"(.*?)</script>", page.text, re.S).group(1))  # type: ignore[union-attr]
    assert config["token"] == "*" * len(token) and config["baseUrl"] == f"/w/{WS}/"
    assert int(page.headers["Content-Length"]) == len(page.content)
    script = re.search(r'src="([^"]+main[^"]+\.js[^"]*)"', page.text).group(1)  # type: ignore[union-attr]
    asset = proxy.get(script, "bob")
    assert asset.status_code == 200 and len(asset.content) > 10_000
    for response in (root, page, asset):
        seen += [response.text, json.dumps(dict(response.headers))]
        # No login cookie of jupyter-server: it would reach the server without the proxy.
        assert not [c for c in response.cookies if c.name.startswith("username-")]

    kernel = _kernel(proxy)
    conn = proxy.websocket(f"/w/{WS}/api/kernels/{kernel}/channels?session_id=s1", "bob")
    try:
        assert _execute(conn, "x = 6 * 7\nprint(x)") == "42\n"
        # Even what the kernel prints cannot carry the token out: its environment has it.
        shown = _execute(conn, "import os\nprint(os.environ['JUPYTER_TOKEN'])")
        assert shown == "*" * len(token) + "\n"
        seen.append(shown)
    finally:
        conn.close()
    assert not any(token in text for text in seen)
    assert token not in proxy.get(f"/w/{WS}/api/sessions", "bob").text


def test_who_gets_in(proxy: Proxy) -> None:
    path = f"/w/{WS}/api/status"
    assert proxy.get(path, "bob").status_code == 200  # the owner
    assert proxy.get(path, "alice").status_code == 200  # a team admin
    for user, status in (("carl", 403), ("carol", 403), (None, 401)):
        answer = proxy.get(path, user)
        assert answer.status_code == status, (user, answer.text)
        assert answer.json()["message"]
    assert "ml-b" not in proxy.get(path, "carol").text  # another team learns nothing
    forged = session.issue("bob", b"not the secret", time.time())[1]
    refused = requests.get(proxy.url + path, cookies={session.COOKIE: forged}, timeout=30)
    assert refused.status_code == 401
    signin = proxy.get(path, None, headers={"Accept": "text/html"})
    assert signin.status_code == 401 and "stasis portal" in signin.text
    assert 'href="http://127.0.0.1:1/portal/"' in signin.text
    # The WebSocket upgrade is decided exactly as the request.
    kernel = _kernel(proxy)
    channels = f"/w/{WS}/api/kernels/{kernel}/channels"
    for user, status in (("carol", 403), ("carl", 403), (None, 401)):
        with pytest.raises(websocket.WebSocketBadStatusException) as refused_ws:
            proxy.websocket(channels, user)
        assert refused_ws.value.status_code == status
    # A page of another site cannot open it with the user's cookie.
    with pytest.raises(websocket.WebSocketBadStatusException) as cross:
        proxy.websocket(channels, "bob", Origin="https://evil.example")
    assert cross.value.status_code == 403
    proxy.websocket(channels, "bob", Origin=proxy.url).close()  # its own pages
    with pytest.raises(websocket.WebSocketBadStatusException):  # even another port here
        proxy.websocket(channels, "bob", Origin="http://127.0.0.1:1")
    moved = proxy.get(f"/w/{WS}", "bob", params={"a": "1"})
    assert moved.status_code == 308 and moved.headers["Location"] == f"/w/{WS}/?a=1"
    assert proxy.get("/w/ml-a--nothing/", "bob").status_code == 410
    assert proxy.get("/elsewhere", "bob").status_code == 404


def test_removing_the_user_from_the_team_closes_their_kernel_websocket_within_2s(
        proxy: Proxy) -> None:
    kernel = _kernel(proxy)
    conn = proxy.websocket(f"/w/{WS}/api/kernels/{kernel}/channels", "bob")
    assert _execute(conn, "print('open')") == "open\n"
    proxy.db.collection("teams").document("ml-a").set(
        {"members": [m for m in MEMBERS if m["user"] != "bob"]})
    removed = time.monotonic()
    code, reason = _until_closed(conn)
    closed_after = time.monotonic() - removed
    assert (code, reason) == (1008, "bob is not a member of team ml-a")
    assert closed_after < 2.0, f"the WebSocket stayed open {closed_after:.2f}s"
    print(f"closed {closed_after:.2f}s after the removal")
    with pytest.raises(websocket.WebSocketBadStatusException) as again:
        proxy.websocket(f"/w/{WS}/api/kernels/{kernel}/channels", "bob")
    assert again.value.status_code == 403
    assert proxy.get(f"/w/{WS}/api/status", "alice").status_code == 200


def test_a_paused_workspace_offers_resume_and_asks_the_lifecycle_once(proxy: Proxy) -> None:
    proxy.state("PAUSED", 5)
    cookies = {session.COOKIE: proxy.cookie("bob")}  # one browser: its session's CSRF token
    page = requests.get(f"{proxy.url}/w/{WS}/lab", headers={"Accept": "text/html"},
                        cookies=cookies, timeout=30)
    assert page.status_code == 409 and "is paused" in page.text
    assert re.search(r"<button[^>]*>Resume</button>", page.text)
    csrf = re.search(r'name="csrf" value="([^"]+)"', page.text).group(1)  # type: ignore[union-attr]
    api = proxy.get(f"/w/{WS}/api/kernels", "bob")
    assert api.status_code == 409 and api.json()["state"] == "PAUSED"
    form = f"{proxy.url}/_stasis/resume/{WS}"
    for data, origin in (({}, proxy.url), ({"csrf": "forged"}, proxy.url),
                         ({"csrf": csrf}, "https://evil.example")):
        refused = requests.post(form, data=data, cookies=cookies, headers={"Origin": origin},
                                timeout=30, allow_redirects=False)
        assert refused.status_code == 403, (data, origin)
    assert pull(proxy.resumes, want=1, timeout=2) == []  # nothing asked yet
    for _ in range(2):  # a double click
        done = requests.post(form, data={"csrf": csrf}, cookies=cookies, timeout=30,
                             headers={"Origin": proxy.url}, allow_redirects=False)
        assert done.status_code == 303 and done.headers["Location"] == f"/w/{WS}/?resume=1"
    # Opening with ?resume=1 (the portal's Open may ask) resumes too.
    opened = proxy.get(f"/w/{WS}/?resume=1", "bob", headers={"Accept": "text/html"})
    assert opened.status_code == 503 and 'http-equiv="refresh"' in opened.text
    asked = pull(proxy.resumes, want=3)
    assert len(asked) == 3
    assert {m.attributes["ce-requestid"] for m in asked} == {f"ide-resume-{WS}-v5"}
    assert {json.loads(m.data)["actor"] for m in asked} == {"bob"}
    # Another member may not resume what is not theirs.
    carl = requests.post(form, data={"csrf": session.csrf_token(
        session.verify(proxy.cookie("carl"), SECRET, time.time()), SECRET)},  # type: ignore[arg-type]
        cookies={session.COOKIE: proxy.cookie("carl")}, headers={"Origin": proxy.url},
        timeout=30, allow_redirects=False)
    assert carl.status_code == 403
    proxy.state("RESUMING", 6)
    deadline = time.monotonic() + 3  # what the proxy read is at most 1.5 s old
    while (waiting := proxy.get(f"/w/{WS}/lab", "bob", headers={"Accept": "text/html"})
           ).status_code == 409 and time.monotonic() < deadline:
        time.sleep(0.1)
    assert waiting.status_code == 503 and waiting.headers["Retry-After"] == "2"
    assert "resuming" in waiting.text


def test_a_queued_workspace_waits_on_a_page_that_looks_again_less_often(proxy: Proxy) -> None:
    """Queued for capacity (issue 19): no Resume to offer and nothing to wait on for long,
    so the page says so and refreshes every 15 s; the IDE's own calls get a 503."""
    proxy.state("QUEUED", 7)
    page = proxy.get(f"/w/{WS}/lab", "bob", headers={"Accept": "text/html"})
    assert page.status_code == 503 and page.headers["Retry-After"] == "15"
    assert "queued for capacity" in page.text and 'http-equiv="refresh"' in page.text
    assert "Resume</button>" not in page.text
    api = proxy.get(f"/w/{WS}/api/kernels", "bob")
    assert api.status_code == 503 and api.json()["state"] == "QUEUED"
    assert proxy.get(f"/w/{WS}/lab", "carl").status_code == 403  # still the owner's alone
