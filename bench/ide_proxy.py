"""The IDE access proxy against the IDE itself, in the same run: what the hop costs.

Starts a Firestore emulator on a free port (the proxy's reads: the workspace and its
team), a real JupyterLab as the node agent starts it (under ``/w/<id>/``), and the IDE
proxy in a process of its own (``functions.ideproxy``, the runtime's status given
directly). Then, alternating direct and through the proxy:

- **page load**: headless Chromium (Debian's) opens JupyterLab in a fresh context (nothing
  cached) until its launcher is shown; ``--loads`` times each way;
- **execute round trip**: one kernel WebSocket (JupyterLab's protocol) sends ``pass`` and
  waits for its reply and the kernel's idle status, ``--executes`` times each way;
- **API request**: ``GET /api/status`` on one kept-alive connection, ``--executes`` times
  each way (the hop alone: the kernel's own latency is not in it);
- **WebSocket messages per second**: ``--burst`` ``kernel_info_request`` messages sent
  without waiting, every message that comes back counted (a reply and two statuses each).

Prints JSON: each figure direct and proxied, and the ratio (target: proxied latency at most
1.2x direct; throughput at least direct / 1.2).

    .venv/bin/python bench/ide_proxy.py [--loads 5] [--executes 300] [--burst 2000]
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import os
import shutil
import sys
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from common import summary  # noqa: E402

WS = "bench--ide"
SECRET = b"bench-secret"
CHROMIUM = "/usr/bin/chromium"


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--loads", type=int, default=5)
    parser.add_argument("--executes", type=int, default=300)
    parser.add_argument("--burst", type=int, default=2000)
    args = parser.parse_args()

    from runtime.local import servers
    from stack.processes import firestore_spec, free_ports, start_many, stop_all
    from stack.settings import Settings

    data_dir = Path(tempfile.mkdtemp(prefix="stasis-bench-ideproxy-"))
    firestore_port, proxy_port = free_ports(2)
    settings = Settings(project="bench", data_dir=data_dir).with_ports(
        {"firestore": firestore_port})
    start_many([firestore_spec(settings)], timeout=90)
    lab = servers.start(servers.ServerLaunch(
        workspace_id=WS, home=data_dir / "home", runtime_dir=data_dir / "run",
        log_path=data_dir / "lab.log", repo_root=ROOT), timeout=120)
    proxy = multiprocessing.get_context("spawn").Process(
        target=_serve, args=(proxy_port, settings.firestore_host, lab.url, lab.token),
        daemon=True)
    try:
        os.environ["FIRESTORE_EMULATOR_HOST"] = settings.firestore_host
        _seed()
        proxy.start()
        proxied = f"http://127.0.0.1:{proxy_port}/w/{WS}"
        _wait(proxied + "/api/status")
        direct = lab.base_url
        results = {
            "page_load_ms": _pair(_page_load, direct, proxied, lab.token, args.loads),
            "execute_round_trip_ms": _pair(_round_trips, direct, proxied, lab.token,
                                           args.executes),
            "api_request_ms": _pair(_requests, direct, proxied, lab.token, args.executes),
            "websocket_messages_per_s": _pair(_burst, direct, proxied, lab.token, args.burst),
        }
        for name, pair in results.items():
            key = "p50" if isinstance(pair["direct"], dict) else None
            d = pair["direct"][key] if key else pair["direct"]
            p = pair["proxied"][key] if key else pair["proxied"]
            pair["ratio"] = round(p / d, 3) if d else None
            if name == "websocket_messages_per_s":
                pair["ratio"] = round(d / p, 3) if p else None  # >1: the proxy is slower
        print(json.dumps({"cpus": os.cpu_count(), "load_1m": round(os.getloadavg()[0], 1),
                          "target": "proxied <= 1.2x direct (ratio of p50 latency, or "
                                    "direct/proxied throughput)", **results}, indent=2))
    finally:
        proxy.terminate()
        proxy.join(10)
        servers.stop(lab, grace=5)
        stop_all(data_dir)
        shutil.rmtree(data_dir, ignore_errors=True)


def _serve(port: int, firestore_host: str, lab_url: str, token: str) -> None:
    """The IDE proxy as ``python -m functions.ideproxy`` builds it, the runtime's status
    given (one server, running)."""
    os.environ["FIRESTORE_EMULATOR_HOST"] = firestore_host
    from aiohttp import web
    from google.cloud import firestore

    from functions.adapters.link_store import FirestoreLinkStore
    from functions.ideproxy.access import Gate, SessionCookies
    from functions.ideproxy.app import IdeProxy, make_app
    from functions.ports import RuntimeStatus

    def status(workspace_id: str) -> RuntimeStatus:
        return RuntimeStatus(workspace_id, True, url=lab_url, token=token,
                             detail={"ide": "jupyterlab"})

    proxy = IdeProxy(Gate(FirestoreLinkStore(firestore.Client(project="bench"))),
                     SessionCookies(SECRET), status, bus=None,  # type: ignore[arg-type]
                     session_secret=SECRET)
    web.run_app(make_app(proxy), host="127.0.0.1", port=port, access_log=None,
                print=lambda *_: None)


def _seed() -> None:
    from google.cloud import firestore

    db = firestore.Client(project="bench")
    db.collection("teams").document("bench").set({"members": [{"user": "dev",
                                                               "role": "admin"}]})
    db.collection("workspaces").document(WS).set({"team": "bench", "owner": "dev",
                                                  "state": "RUNNING", "version": 1})


def _cookie() -> str:
    from functions.portal import session

    return session.issue("dev", SECRET, time.time())[1]


def _wait(url: str) -> None:
    import requests

    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        try:
            if requests.get(url, cookies={"stasis_session": _cookie()}, timeout=2).ok:
                return
        except requests.RequestException:
            pass
        time.sleep(0.2)
    raise SystemExit(f"the proxy did not answer at {url}")


def _pair(measure: Any, direct: str, proxied: str, token: str, n: int) -> dict[str, Any]:
    """The same measure both ways, alternating halves so that load drifts hit both."""
    half = max(1, n // 2)
    results: dict[str, list[float]] = {"direct": [], "proxied": []}
    for _ in range(2):
        results["direct"] += measure(direct, token, half, via_proxy=False)
        results["proxied"] += measure(proxied, token, half, via_proxy=True)
    if measure is _burst:
        return {k: round(sum(v) / len(v)) for k, v in results.items()}
    return {k: summary(v, 2) for k, v in results.items()}


def _page_load(base: str, token: str, n: int, *, via_proxy: bool) -> list[float]:
    from playwright.sync_api import sync_playwright

    times = []
    with sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path=CHROMIUM,
                                     args=["--headless", "--no-sandbox", "--disable-gpu"])
        try:
            for _ in range(n):
                # Each way authenticated on every request, as the proxy authenticates to
                # the IDE: the session cookie, or the token header straight to JupyterLab.
                context = browser.new_context(extra_http_headers=None if via_proxy else {
                    "Authorization": f"token {token}"})
                if via_proxy:
                    context.add_cookies([{"name": "stasis_session", "value": _cookie(),
                                          "url": base.split("/w/")[0]}])
                page = context.new_page()
                started = time.perf_counter()
                page.goto(base + "/lab")
                page.locator(".jp-Launcher").first.wait_for(timeout=120_000)
                times.append((time.perf_counter() - started) * 1000)
                context.close()
        finally:
            browser.close()
    return times


def _requests(base: str, token: str, n: int, *, via_proxy: bool) -> list[float]:
    import requests

    http = requests.Session()
    http.trust_env = False
    if via_proxy:
        http.cookies.set("stasis_session", _cookie())
    else:
        http.headers["Authorization"] = f"token {token}"
    times = []
    for i in range(n + 5):
        started = time.perf_counter()
        http.get(f"{base}/api/status", timeout=30).raise_for_status()
        if i >= 5:
            times.append((time.perf_counter() - started) * 1000)
    http.close()
    return times


def _channels(base: str, token: str, via_proxy: bool) -> Any:
    import requests
    import websocket

    headers = {"Authorization": f"token {token}"} if not via_proxy else {}
    cookies = {"stasis_session": _cookie()} if via_proxy else {}
    kernels = requests.get(f"{base}/api/kernels", headers=headers, cookies=cookies, timeout=30)
    found = kernels.json()
    if not found:
        found = [requests.post(f"{base}/api/kernels", json={"name": "python3"},
                               headers=headers, cookies=cookies, timeout=60).json()]
    header = [f"Authorization: token {token}"] if not via_proxy else [
        f"Cookie: stasis_session={cookies['stasis_session']}"]
    url = base.replace("http", "ws", 1) + f"/api/kernels/{found[0]['id']}/channels"
    return websocket.create_connection(url, header=header, timeout=60, suppress_origin=True)


def _message(kind: str, content: dict[str, Any]) -> tuple[str, str]:
    msg_id = uuid.uuid4().hex
    return msg_id, json.dumps({
        "header": {"msg_id": msg_id, "msg_type": kind, "username": "bench",
                   "session": "bench", "version": "5.3"},
        "parent_header": {}, "metadata": {}, "channel": "shell", "content": content})


def _round_trips(base: str, token: str, n: int, *, via_proxy: bool) -> list[float]:
    conn = _channels(base, token, via_proxy)
    times = []
    try:
        for i in range(n + 5):
            msg_id, text = _message("execute_request", {
                "code": "pass", "silent": False, "store_history": False,
                "user_expressions": {}, "allow_stdin": False, "stop_on_error": True})
            started = time.perf_counter()
            conn.send(text)
            replied = idle = False
            while not (replied and idle):
                message = json.loads(conn.recv())
                if message.get("parent_header", {}).get("msg_id") != msg_id:
                    continue
                replied = replied or message["msg_type"] == "execute_reply"
                idle = idle or (message["msg_type"] == "status"
                                and message["content"]["execution_state"] == "idle")
            if i >= 5:  # the first few warm the path
                times.append((time.perf_counter() - started) * 1000)
    finally:
        conn.close()
    return times


def _burst(base: str, token: str, n: int, *, via_proxy: bool) -> list[float]:
    conn = _channels(base, token, via_proxy)
    try:
        ids = set()
        started = time.perf_counter()
        for _ in range(n):
            msg_id, text = _message("kernel_info_request", {})
            ids.add(msg_id)
            conn.send(text)
        received = idle = 0
        while idle < n:
            message = json.loads(conn.recv())
            received += 1
            if message.get("parent_header", {}).get("msg_id") in ids and \
                    message["msg_type"] == "status" and \
                    message["content"]["execution_state"] == "idle":
                idle += 1
        return [received / (time.perf_counter() - started)]
    finally:
        conn.close()


if __name__ == "__main__":
    main()
