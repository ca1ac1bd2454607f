"""The access proxy's authorization check under load: p50/p99 at 500 requests/s on loopback.

Starts the Firestore emulator (own process group, in memory) unless ``--firestore HOST`` is
given, seeds a team, a RUNNING workspace and ``--links`` links, and serves the proxy the
way the function host does (gunicorn, gthread, one worker, 16 threads) in a child process.
The load is open-loop: requests are scheduled at a fixed ``--rate`` for ``--seconds``,
spread round-robin over the links (each well under its own rate limit), each on one of a
pool of keep-alive connections, and every request is the link-info call
``GET /proxy/<ws>/``: the full check (token shape, cached or Firestore reads of the link,
the team and the workspace, the domain's decision, the rate limits) and a small JSON
answer, no kernel.

Reported (JSON):

- ``check_ms``: the check as the proxy times it itself (``Server-Timing: auth;dur=``),
  from the request reaching the function to the decision; cache misses (every 0.5 s per
  link: the revocation bound) included;
- ``round_trip_ms``: client-side, from the *scheduled* send time (so a server that falls
  behind shows up as latency, not as a lower rate) to the full response;
- ``check_cpu_ms``: the CPU time the check's thread spent on it (``authcpu``): what the
  check costs, apart from waiting for a CPU on a busy host;
- ``in_process``: the same check without HTTP, ``Authorizer.authorize`` paced at the same
  rate from one thread (read-ahead running), wall and CPU;
- the achieved rate, every status seen (all 200 when healthy) and the host's 1-minute load
  average before and after (on a shared machine, the wall-clock tail is mostly the load).

    .venv/bin/python bench/link_check.py [--rate 500] [--seconds 10] [--links 100]
"""

from __future__ import annotations

import argparse
import http.client
import json
import os
import platform
import queue
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections import Counter
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

WS = "bench--load"
PROJECT = "bench-links"


# --- the served app (gunicorn imports this: bench.link_check:serve_app()) -------------------------
def serve_app() -> Any:
    from google.cloud import firestore

    from functions.adapters.iap import DevIdentity
    from functions.adapters.link_store import FirestoreLinkStore
    from functions.proxy.access import AccessProxy, wsgi

    class NoKernels:  # the info call never reaches a kernel
        def server(self, *args: Any) -> None:
            return None

    class NoBus:
        def publish(self, event: Any) -> str:
            raise RuntimeError("the benchmark publishes nothing")

    store = FirestoreLinkStore(firestore.Client(project=os.environ["STASIS_PROJECT"]))
    proxy = AccessProxy(store, NoKernels(), NoBus(), DevIdentity(),  # type: ignore[arg-type]
                        clock=lambda: datetime.now(UTC))
    return wsgi(proxy)


# --- setup ----------------------------------------------------------------------------------------
def _seed(links: int) -> list[str]:
    from google.cloud import firestore

    from functions.adapters.link_store import FirestoreLinkStore
    from functions.domain.links import Link, Scope, link_id_from, token_hash
    from functions.proxy.issuer import new_token

    db = firestore.Client(project=PROJECT)
    db.collection("teams").document("bench").set({
        "id": "bench", "members": [{"user": "bench", "role": "admin"}],
        "member_ids": ["bench"]})
    db.collection("workspaces").document(WS).set({
        "id": WS, "team": "bench", "owner": "bench", "name": "load", "state": "RUNNING",
        "version": 2})
    store = FirestoreLinkStore(db)
    now = datetime.now(UTC)
    tokens = []
    for i in range(links):
        token = new_token()
        store.create_link(token_hash(token), Link(
            link_id=link_id_from(f"{i:016x}"), workspace=WS, team="bench", creator="bench",
            scope=Scope.EXEC, created_at=now, expires_at=now + timedelta(hours=1)),
            {"action": "link.created", "time": now})
        tokens.append(token)
    return tokens


def _wait_ready(port: int, token: str, timeout: float = 60) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            conn = http.client.HTTPConnection("127.0.0.1", port, timeout=5)
            conn.request("GET", f"/{WS}/", headers={"Authorization": f"Bearer {token}"})
            if conn.getresponse().status == 200:
                return
        except OSError:
            pass
        time.sleep(0.2)
    raise RuntimeError("the proxy did not come up")


# --- load -----------------------------------------------------------------------------------------
def _load(port: int, tokens: list[str], rate: float, seconds: float,
          connections: int) -> dict[str, Any]:
    total = int(rate * seconds)
    jobs: queue.Queue[tuple[float, str] | None] = queue.Queue()
    results: list[tuple[float, float, int, float]] = []  # check, round trip, status, cpu
    lock = threading.Lock()
    late = [0]

    def worker() -> None:
        conn = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
        while True:
            job = jobs.get()
            if job is None:
                return
            scheduled, token = job
            delay = scheduled - time.perf_counter()
            if delay > 0:
                time.sleep(delay)
            elif delay < -0.001:
                with lock:
                    late[0] += 1
            try:
                conn.request("GET", f"/{WS}/", headers={"Authorization": f"Bearer {token}"})
                response = conn.getresponse()
                response.read()
            except (OSError, http.client.HTTPException):
                conn.close()
                conn = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
                with lock:
                    results.append((float("nan"), float("nan"), 0, float("nan")))
                continue
            done = time.perf_counter()
            timing = dict(part.strip().split(";dur=") for part in
                          (response.getheader("Server-Timing") or "auth;dur=nan").split(","))
            with lock:
                results.append((float(timing["auth"]), (done - scheduled) * 1000,
                                response.status, float(timing.get("authcpu", "nan"))))

    threads = [threading.Thread(target=worker, daemon=True) for _ in range(connections)]
    for thread in threads:
        thread.start()
    start = time.perf_counter() + 0.2
    for i in range(total):
        jobs.put((start + i / rate, tokens[i % len(tokens)]))
    for _ in threads:
        jobs.put(None)
    for thread in threads:
        thread.join()
    elapsed = time.perf_counter() - start
    checks = sorted(r[0] for r in results if r[2] == 200)
    trips = sorted(r[1] for r in results if r[2] == 200)
    cpu = sorted(r[3] for r in results if r[2] == 200)
    return {
        "requests": total, "achieved_rate": round(total / elapsed, 1),
        "statuses": dict(Counter(str(r[2]) for r in results)),
        "started_late": late[0],
        "check_ms": _summary(checks), "check_cpu_ms": _summary(cpu),
        "round_trip_ms": _summary(trips)}


def _in_process(tokens: list[str], rate: float, seconds: float) -> dict[str, Any]:
    """The check alone, no HTTP: ``Authorizer.authorize`` paced at ``rate`` from one thread,
    on the same Firestore store, with the proxy's read-ahead running."""
    from google.cloud import firestore

    from functions.adapters.iap import DevIdentity
    from functions.adapters.link_store import FirestoreLinkStore
    from functions.domain.links import Operation
    from functions.proxy.access import AccessProxy

    store = FirestoreLinkStore(firestore.Client(project=PROJECT))
    proxy = AccessProxy(store, None, None, DevIdentity(),  # type: ignore[arg-type]
                        clock=lambda: datetime.now(UTC))
    proxy._start_refresher()
    try:
        walls, cpus, verdicts = [], [], Counter()
        total = int(rate * seconds)
        start = time.perf_counter() + 0.1
        for i in range(total):
            delay = start + i / rate - time.perf_counter()
            if delay > 0:
                time.sleep(delay)
            t0, c0 = time.perf_counter(), time.thread_time()
            access = proxy.auth.authorize(tokens[i % len(tokens)], client="bench",
                                          workspace_id=WS, operation=Operation.READ)
            walls.append((time.perf_counter() - t0) * 1000)
            cpus.append((time.thread_time() - c0) * 1000)
            verdicts[str(access.verdict.reason)] += 1
    finally:
        proxy.close()
    return {"requests": total, "verdicts": dict(verdicts),
            "check_ms": _summary(sorted(walls)), "check_cpu_ms": _summary(sorted(cpus))}


def _summary(values: list[float]) -> dict[str, float]:
    from bench.common import summary  # after ROOT is on the path (gunicorn imports this too)

    return summary(values, digits=3)


# --- main -----------------------------------------------------------------------------------------
def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rate", type=float, default=500)
    parser.add_argument("--seconds", type=float, default=10)
    parser.add_argument("--links", type=int, default=100)
    parser.add_argument("--connections", type=int, default=16)
    parser.add_argument("--server-threads", type=int, default=16,
                        help="gunicorn threads (the function host runs 16)")
    parser.add_argument("--firestore", default=None, help="HOST:PORT of a running emulator")
    args = parser.parse_args()

    from stack import processes
    from stack.settings import Settings

    emulator = None
    tmp = tempfile.TemporaryDirectory(prefix="stasis-bench-links-")
    try:
        for attempt in range(3 if args.firestore is None else 0):
            # Fresh ports per attempt: on a shared machine a free port can be taken before
            # the emulator binds it.
            settings = processes.on_free_ports(Settings(project=PROJECT,
                                                        data_dir=Path(tmp.name)))
            try:
                emulator = processes.start(processes.firestore_spec(settings), timeout=120)
            except processes.ServiceError:
                if attempt == 2:
                    raise
                continue
            args.firestore = settings.firestore_host
            break
        os.environ.update(FIRESTORE_EMULATOR_HOST=args.firestore, STASIS_PROJECT=PROJECT,
                          GOOGLE_CLOUD_PROJECT=PROJECT)
        tokens = _seed(args.links)
        [port] = processes.free_ports(1)
        gunicorn = Path(sys.executable).with_name("gunicorn")
        server = subprocess.Popen(
            [str(gunicorn), "--bind", f"127.0.0.1:{port}", "--worker-class", "gthread",
             "--workers", "1", "--threads", str(args.server_threads), "--chdir", str(ROOT),
             "bench.link_check:serve_app()"],
            env={**os.environ, "PYTHONPATH": str(ROOT)}, cwd=ROOT,
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
        try:
            _wait_ready(port, tokens[0])
            _load(port, tokens, min(args.rate, 100), 1.0, args.connections)  # warm up
            time.sleep(1.0)
            load_before = os.getloadavg()[0]
            report = _load(port, tokens, args.rate, args.seconds, args.connections)
            report["load_average"] = [round(load_before, 2), round(os.getloadavg()[0], 2)]
            report["in_process"] = _in_process(tokens, args.rate, args.seconds)
        finally:
            os.killpg(server.pid, signal.SIGTERM)
            server.wait(timeout=30)
    finally:
        if emulator is not None:
            processes.stop(emulator)
        tmp.cleanup()
    print(json.dumps({
        "benchmark": "link_check", "rate": args.rate, "seconds": args.seconds,
        "links": args.links, "connections": args.connections,
        "cache_seconds": 0.5,
        "server": f"gunicorn gthread, 1 worker x {args.server_threads} threads",
        "host": {"cpus": os.cpu_count(), "python": platform.python_version()},
        **report}, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
