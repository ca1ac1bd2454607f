"""N servers brought to ready at once: Stasis beside JupyterHub, on the same host, in one run.

    .venv/bin/python bench/spawn_vs_jupyterhub.py [--n 10] [--warm-pool 10] [--skip-hub]

JupyterHub side: a bench-only environment under ``build/jupyterhub-bench/`` (a venv with
JupyterHub 6 and JupyterLab from PyPI, configurable-http-proxy from npm; made on first use),
JupyterHub on free loopback ports with its ``SimpleLocalProcessSpawner`` (every user's
server a local process, as Stasis's local runtime), the dummy authenticator, and an admin
service token. N users are created, then all N servers requested at once through the REST
API; the clock stops when the last one reports ready.

Stasis side: a private local stack (free ports, its own data dir) with the example admin
file, the python-3-11 environment's ``warm_pool`` set to ``--warm-pool`` (and the pool
filled before the clock starts, which is the point of a pool: say 0 for a cold run); then N
``stasis ws create --wait`` processes at once, one CLI process each, as N users would; the
clock stops when the last one returned with its workspace RUNNING.

Prints one JSON object: both rates (servers per second), the ratio (target: Stasis >= 2x),
each side's per-server times, and the load average (the machine is shared).
"""

from __future__ import annotations

import argparse
import concurrent.futures
import contextlib
import json
import os
import secrets
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from common import summary  # noqa: E402

BENCH_ENV = ROOT / "build" / "jupyterhub-bench"
HUB_PACKAGES = ["jupyterhub==6.1.1", "jupyterlab>=4,<5"]
CHP_PACKAGE = "configurable-http-proxy@5.3.0"


def ensure_hub_env() -> tuple[Path, Path]:
    """The bench-only venv's bin dir and the proxy's executable (installed when missing)."""
    venv, npm_dir = BENCH_ENV / "venv", BENCH_ENV / "chp"
    if not (venv / "bin" / "jupyterhub").exists():
        subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
        subprocess.run([str(venv / "bin" / "pip"), "install", "--quiet", *HUB_PACKAGES],
                       check=True)
    chp = npm_dir / "node_modules" / ".bin" / "configurable-http-proxy"
    if not chp.exists():
        npm_dir.mkdir(parents=True, exist_ok=True)
        subprocess.run(["npm", "install", "--prefix", str(npm_dir), "--no-audit", "--no-fund",
                        "--loglevel=error", CHP_PACKAGE], check=True)
    return venv / "bin", chp


def _free_port() -> int:
    from runtime.supervisor import free_port

    return free_port()


HUB_CONFIG = """
c = get_config()  # noqa
from jupyterhub.spawner import SimpleLocalProcessSpawner
c.JupyterHub.spawner_class = SimpleLocalProcessSpawner
c.SimpleLocalProcessSpawner.home_dir_template = {homes!r} + "/{{username}}"
c.Spawner.cmd = [{singleuser!r}]
c.Spawner.default_url = "/lab"
c.Spawner.args = ["--allow-root"] if {root!r} else []
c.Spawner.start_timeout = 300
c.Spawner.http_timeout = 300
c.JupyterHub.authenticator_class = "dummy"
c.JupyterHub.ip = "127.0.0.1"
c.JupyterHub.port = {port}
c.JupyterHub.hub_ip = "127.0.0.1"
c.JupyterHub.hub_port = {hub_port}
c.ConfigurableHTTPProxy.command = [{chp!r}]
c.ConfigurableHTTPProxy.api_url = "http://127.0.0.1:{proxy_api_port}"
c.JupyterHub.db_url = "sqlite:///" + {db!r}
c.JupyterHub.cookie_secret_file = {cookie!r}
c.JupyterHub.pid_file = {pid!r}
c.JupyterHub.concurrent_spawn_limit = 0
c.JupyterHub.active_server_limit = 0
c.JupyterHub.services = [{{"name": "bench", "api_token": {token!r}, "admin": True}}]
c.JupyterHub.load_roles = [{{"name": "bench", "services": ["bench"],
                            "scopes": ["admin:users", "admin:servers", "read:users"]}}]
"""


def run_hub(n: int) -> dict[str, Any]:
    import requests

    bin_dir, chp = ensure_hub_env()
    work = Path(tempfile.mkdtemp(prefix="hub-bench-"))
    (work / "homes").mkdir()
    token = secrets.token_hex(16)
    port = _free_port()
    config = HUB_CONFIG.format(
        homes=str(work / "homes"), singleuser=str(bin_dir / "jupyterhub-singleuser"),
        root=os.geteuid() == 0, port=port, hub_port=_free_port(), chp=str(chp),
        proxy_api_port=_free_port(), db=str(work / "hub.sqlite"),
        cookie=str(work / "cookie"), pid=str(work / "hub.pid"), token=token)
    (work / "jupyterhub_config.py").write_text(config)
    env = {**os.environ, "PATH": f"{bin_dir}:{os.environ['PATH']}"}
    log = open(work / "hub.log", "wb")  # noqa: SIM115 (closed below)
    hub = subprocess.Popen([str(bin_dir / "jupyterhub"), "-f", str(work / "jupyterhub_config.py")],
                           cwd=work, env=env, stdout=log, stderr=subprocess.STDOUT,
                           start_new_session=True)
    api = f"http://127.0.0.1:{port}/hub/api"
    headers = {"Authorization": f"token {token}"}
    session = requests.Session()
    session.trust_env = False
    try:
        deadline = time.monotonic() + 120
        while True:
            try:
                if session.get(f"{api}/", timeout=2).ok:
                    break
            except requests.RequestException:
                pass
            if hub.poll() is not None or time.monotonic() > deadline:
                raise SystemExit(f"JupyterHub did not start: see {work / 'hub.log'}")
            time.sleep(0.2)
        users = [f"u{i}" for i in range(n)]
        session.post(f"{api}/users", json={"usernames": users}, headers=headers,
                     timeout=30).raise_for_status()

        def request(user: str) -> None:
            # The hub holds each request up to its slow_spawn_timeout (10 s): at once means
            # one request per user in flight together, as N users clicking "start".
            answer = requests.post(f"{api}/users/{user}/server", headers=headers, timeout=120)
            if answer.status_code not in (201, 202):
                raise SystemExit(f"JupyterHub refused {user}'s server: {answer.text}")

        began = time.monotonic()
        with concurrent.futures.ThreadPoolExecutor(n) as clicks:
            list(clicks.map(request, users))
        ready_at: dict[str, float] = {}
        while len(ready_at) < n and time.monotonic() - began < 600:
            for user in users:
                if user in ready_at:
                    continue
                info = session.get(f"{api}/users/{user}", headers=headers, timeout=30).json()
                if (info.get("servers") or {}).get("", {}).get("ready"):
                    ready_at[user] = time.monotonic() - began
            time.sleep(0.1)
        total = max(ready_at.values()) if len(ready_at) == n else float("nan")
        return {"n": n, "ready": len(ready_at), "seconds": round(total, 2),
                "servers_per_s": round(n / total, 3), "each_s": summary(list(ready_at.values()), 2)}
    finally:
        for user in [f"u{i}" for i in range(n)]:
            with contextlib.suppress(requests.RequestException):
                session.delete(f"{api}/users/{user}/server", headers=headers, timeout=30)
        hub.terminate()
        try:
            hub.wait(timeout=30)
        except subprocess.TimeoutExpired:
            os.killpg(hub.pid, 9)
        log.close()
        shutil.rmtree(work, ignore_errors=True)


def run_stasis(n: int, warm_pool: int) -> dict[str, Any]:
    import yaml
    from common import private_stack

    from stack import admin, local

    config = yaml.safe_load((ROOT / "examples" / "stasis.yaml").read_text())
    for environment in config["environments"]:
        environment["warm_pool"] = warm_pool if environment["id"] == "python-3-11" else 0
    with private_stack(runtime="local") as (settings, _report):
        admin.apply(settings, config, actor="bench")
        deadline = time.monotonic() + 300
        while time.monotonic() < deadline:
            pools = (local.warm_pools(settings) or {}).get("environments", {})
            if pools.get("python-3-11", {}).get("waiting", 0) >= warm_pool:
                break
            time.sleep(0.5)
        env = {**os.environ, **settings.emulator_env(), "STASIS_USER": "dev",
               "STASIS_DATA_DIR": str(settings.data_dir), "STASIS_PROJECT": settings.project,
               **{f"STASIS_{name.upper()}_PORT": str(port)
                  for name, port in settings.ports().items()}}
        stasis = str(Path(sys.executable).parent / "stasis")

        def create(i: int) -> float:
            began = time.monotonic()
            subprocess.run([stasis, "ws", "create", f"spawn{i}", "--team", "ml-a",
                            "--profile", "cpu-small", "--wait"], env=env, check=True,
                           stdout=subprocess.DEVNULL, timeout=600)
            return time.monotonic() - began

        began = time.monotonic()
        with concurrent.futures.ThreadPoolExecutor(n) as pool:
            each = list(pool.map(create, range(n)))
        total = time.monotonic() - began
        return {"n": n, "warm_pool": warm_pool, "seconds": round(total, 2),
                "servers_per_s": round(n / total, 3), "each_s": summary(each, 2)}


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--n", type=int, default=10)
    parser.add_argument("--warm-pool", type=int, default=10)
    parser.add_argument("--skip-hub", action="store_true")
    args = parser.parse_args()
    load_before = os.getloadavg()
    hub = None if args.skip_hub else run_hub(args.n)
    stasis = run_stasis(args.n, args.warm_pool)
    ratio = (round(stasis["servers_per_s"] / hub["servers_per_s"], 2)
             if hub and hub["servers_per_s"] == hub["servers_per_s"] else None)
    print(json.dumps({"jupyterhub": hub, "stasis": stasis, "ratio": ratio, "target_ratio": 2.0,
                      "load_before": [round(x, 1) for x in load_before],
                      "load_after": [round(x, 1) for x in os.getloadavg()]}, indent=1))


if __name__ == "__main__":
    main()
