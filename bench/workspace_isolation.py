"""What isolation costs a start: a JupyterLab server on the environment's interpreter
(``shared``), with the home venv (``venv``: ``runtime.local.userenv``), and with the home
venv run as the workspace's own OS user (``user``: ``runtime.local.tenancy``), same run.

    python bench/workspace_isolation.py [--rounds 3]

For each round, in turn: a *first start* (an empty home: the venv is made, the home given
to its user) and a *resume start* (the home and its venv exist), in each mode, each timed
from spawn to the server answering; then one kernel started on it, timed until it answers.
Prints JSON (medians, seconds). ``user`` needs root and an interpreter other users may run:
every mode then runs on the host's ``/usr/bin/python3.X`` layered on this venv (the venv's
own interpreter is under ``/root``), so the three differ only in what is measured.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import site
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from jupyter_client.blocking.client import BlockingKernelClient

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from runtime.local import servers, tenancy, userenv  # noqa: E402


def _kernel_seconds(server: servers.ServerProcess, runtime_dir: Path) -> float:
    import requests

    began = time.monotonic()
    base = server.url.removesuffix("/lab")
    session = requests.post(f"{base}/api/sessions", timeout=60,
                            headers={"Authorization": f"token {server.token}"},
                            json={"path": "b.ipynb", "name": "b.ipynb", "type": "notebook",
                                  "kernel": {"name": "python3"}}).json()
    connection = runtime_dir / f"kernel-{session['kernel']['id']}.json"
    while True:
        client = BlockingKernelClient(connection_file=str(connection))
        client.load_connection_file()
        client.start_channels()
        try:
            client.wait_for_ready(timeout=60)
            return time.monotonic() - began
        except RuntimeError:  # a heartbeat missed while the kernel starts
            time.sleep(0.2)
        finally:
            client.stop_channels()


def _shared_python(directory: Path) -> str | None:
    """A venv of the host's Python of this minor version, layered on this venv (what the
    tests use too), or None where there is none."""
    host = Path(f"/usr/bin/python{sys.version_info.major}.{sys.version_info.minor}")
    if not host.exists():
        return None
    venv = directory / "shared-py"
    subprocess.run([str(host), "-m", "venv", "--without-pip", str(venv)], check=True)
    (own,) = (venv / "lib").glob("python*/site-packages")
    (own / "repo-venv.pth").write_text("".join(
        f"import site; site.addsitedir({p!r})\n" for p in site.getsitepackages()))
    subprocess.run(["chmod", "-R", "go+rX", str(venv)], check=True)
    return str(venv / "bin" / "python")


def _start(home: Path, mode: str, python: str, uid: int | None) -> tuple[float, float]:
    launch = servers.ServerLaunch(workspace_id="bench--iso", home=home,
                                  runtime_dir=home.parent / f"run-{home.name}",
                                  log_path=home.parent / f"{home.name}.log", repo_root=ROOT,
                                  python=python, uid=uid if mode == "user" else None)
    real = userenv.ensure
    if mode == "shared":
        userenv.ensure = lambda h, python, uid=None: userenv.UserEnv(  # type: ignore
            Path(python), {})
    try:
        began = time.monotonic()
        server = servers.start(launch, timeout=120)
        ready = time.monotonic() - began
    finally:
        userenv.ensure = real  # type: ignore[assignment]
    try:
        return ready, _kernel_seconds(server, launch.runtime_dir)
    finally:
        servers.stop(server, grace=5)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    times: dict[str, list[float]] = {}
    tmp = Path(tempfile.mkdtemp(prefix="stasis-bench-iso-"))
    os.chmod(tmp, 0o711)  # workspace users pass through to their homes
    try:
        shared = _shared_python(tmp) if os.geteuid() == 0 else None
        python = shared or sys.executable
        why_not = tenancy.detect(ROOT).refusal(python, tmp)
        modes = ("shared", "venv", "user") if why_not is None else ("shared", "venv")
        for round_ in range(args.rounds):
            for mode in modes:
                home = tmp / f"{mode}-{round_}"
                for phase in ("first_start", "resume_start"):
                    ready, kernel = _start(home, mode, python, tenancy.UID_BASE + round_)
                    times.setdefault(f"{phase}_{mode}_s", []).append(ready)
                    times.setdefault(f"{phase}_{mode}_kernel_s", []).append(kernel)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    report: dict[str, Any] = {k: round(statistics.median(v), 3) for k, v in sorted(times.items())}
    report.update(rounds=args.rounds, python=python, user_mode=why_not or "measured",
                  load=round(os.getloadavg()[0], 1))
    print(json.dumps(report, indent=2))


if __name__ == "__main__":
    main()
