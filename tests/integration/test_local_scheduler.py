"""The local Cloud Scheduler: the same jobs as Terraform's, called on schedule, for real."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest
import requests

from deploy.tfvars import deployment
from functions.routes import HTTP_FUNCTIONS, SCHEDULER
from stack.processes import free_ports
from stack.scheduler import schedules

ROOT = Path(__file__).resolve().parents[2]


def test_the_jobs_are_the_ones_terraform_gets():
    expected = {n: r.schedule for n, r in HTTP_FUNCTIONS.items() if r.exposure is SCHEDULER}
    assert schedules({}) == expected
    assert schedules({}) == {n: f["schedule"] for n, f in deployment().http_functions.items()
                             if f["access"] == "scheduler" and f.get("schedule")}
    assert {"reconcile", "idle_sweep", "janitor", "cost_rollup"} <= set(expected)


def test_an_override_changes_or_disables_a_job_and_a_bad_one_is_refused():
    table = schedules({"STASIS_SCHEDULE_IDLE_SWEEP": "*/1 * * * *",
                       "STASIS_SCHEDULE_JANITOR": ""})
    assert table["idle_sweep"] == "*/1 * * * *" and "janitor" not in table
    with pytest.raises(ValueError, match="STASIS_SCHEDULE_RECONCILE"):
        schedules({"STASIS_SCHEDULE_RECONCILE": "every now and then"})


class _Recorder(BaseHTTPRequestHandler):
    calls: list[str] = []

    def do_POST(self) -> None:
        type(self).calls.append(self.path)
        code = 500 if self.path.startswith("/janitor") else 200
        self.send_response(code)
        self.send_header("Content-Length", "2")
        self.end_headers()
        self.wfile.write(b"{}")

    def log_message(self, *args) -> None:
        return


def test_the_process_calls_each_function_on_schedule_and_reports_failures():
    functions_port, port = free_ports(2)
    server = ThreadingHTTPServer(("127.0.0.1", functions_port), _Recorder)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    env = {**os.environ, "PYTHONPATH": str(ROOT),
           **{f"STASIS_SCHEDULE_{n.upper()}": "" for n in schedules({})},
           "STASIS_SCHEDULE_IDLE_SWEEP": "* * * * * */1",   # every second
           "STASIS_SCHEDULE_JANITOR": "* * * * * */1"}      # answers 500
    proc = subprocess.Popen([sys.executable, "-m", "stack.scheduler", "--port", str(port),
                             "--functions-url", f"http://127.0.0.1:{functions_port}"],
                            env=env, cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    try:
        deadline = time.monotonic() + 30
        state = None
        while time.monotonic() < deadline:
            try:
                state = requests.get(f"http://127.0.0.1:{port}/", timeout=2).json()
            except requests.RequestException:
                state = None
            if state and _Recorder.calls.count("/idle_sweep/") >= 2 and \
                    state["jobs"]["janitor"]["last"]:
                break
            time.sleep(0.2)
        assert state is not None, proc.stderr.read().decode() if proc.poll() is not None else ""
    finally:
        proc.terminate()
        proc.wait(10)
        server.shutdown()
    assert set(state["jobs"]) == {"idle_sweep", "janitor"}  # the others were disabled
    assert _Recorder.calls.count("/idle_sweep/") >= 2  # again and again, not once
    assert "/reconcile/" not in _Recorder.calls
    assert state["jobs"]["idle_sweep"]["last"]["status"] == 200
    janitor = state["jobs"]["janitor"]["last"]
    assert janitor["status"] == 500 and janitor["error"] is not None
    json.dumps(state)  # plain JSON all the way
