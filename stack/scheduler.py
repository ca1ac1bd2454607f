"""The local stack's Cloud Scheduler: it calls the scheduled HTTP functions on their schedules.

On Google Cloud, Terraform makes one Cloud Scheduler job per scheduled HTTP function: the
scheduler-only functions of ``functions/routes.py`` with the cron their route names
(reconcile every 10 minutes, idle_sweep every 5, janitor and cost_rollup hourly). `stasis up`
runs this process on the same table so that the local stack behaves the same: idle
workspaces pause by themselves and snapshots expire by policy without anyone typing
`stasis idle sweep`.

    python -m stack.scheduler --port P --functions-url URL
    GET /      {"jobs": {name: {"schedule", "next", "last": {"at", "status", "seconds",
                                                          "error"}}}}

A schedule is overridden with ``STASIS_SCHEDULE_<NAME>`` (a cron expression; a sixth field,
after the day of week, counts seconds: ``* * * * * */3`` is every 3 s; empty disables
the job), as ``schedule_overrides`` does in Terraform.
A call that fails is logged and shown under ``last``; the next one comes on schedule
(Cloud Scheduler retries too, but a sweep that failed is simply done again by the next one).
Cron times are UTC.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import sys
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import requests
from croniter import croniter

log = logging.getLogger("stasis.scheduler")
CALL_TIMEOUT = 600


def schedules(environ: Mapping[str, str] | None = None) -> dict[str, str]:
    """Function name -> cron, exactly the Cloud Scheduler jobs Terraform makes, with the
    ``STASIS_SCHEDULE_<NAME>`` overrides."""
    from functions.routes import HTTP_FUNCTIONS, Exposure

    env = os.environ if environ is None else environ
    table: dict[str, str] = {}
    for name, route in HTTP_FUNCTIONS.items():
        if route.exposure is not Exposure.SCHEDULER:
            continue
        cron = env.get(f"STASIS_SCHEDULE_{name.upper()}", route.schedule or "")
        if cron.strip():
            if not croniter.is_valid(cron):
                raise ValueError(f"STASIS_SCHEDULE_{name.upper()}: not a cron expression: "
                                 f"{cron!r}")
            table[name] = cron
    return table


@dataclass
class Job:
    name: str
    cron: str
    next_at: datetime
    last: dict[str, Any] = field(default_factory=dict)


class Scheduler:
    def __init__(self, functions_url: str, table: Mapping[str, str], *,
                 clock: Callable[[], datetime] = lambda: datetime.now(UTC),
                 session: requests.Session | None = None) -> None:
        self.functions_url = functions_url.rstrip("/")
        self.clock = clock
        self._session = session or requests.Session()
        self._session.trust_env = False  # loopback: no proxy from the environment
        now = clock()
        self.jobs = {name: Job(name, cron, croniter(cron, now).get_next(datetime))
                     for name, cron in table.items()}
        self._lock = threading.Lock()

    def due(self) -> list[Job]:
        now = self.clock()
        return [job for job in self.jobs.values() if job.next_at <= now]

    def fire(self, job: Job) -> None:
        """Call the function once and schedule the next call after now (a call that took
        longer than the period skips the missed times, as Cloud Scheduler does)."""
        started = self.clock()
        began = time.monotonic()
        try:
            response = self._session.post(f"{self.functions_url}/{job.name}/",
                                          timeout=CALL_TIMEOUT)
            status, error = response.status_code, None if response.ok else response.text[:300]
        except requests.RequestException as exc:
            status, error = None, str(exc)
        if error:
            log.warning("%s failed: %s %s", job.name, status, error)
        with self._lock:
            job.last = {"at": started.isoformat(), "status": status,
                        "seconds": round(time.monotonic() - began, 3), "error": error}
            job.next_at = croniter(job.cron, self.clock()).get_next(datetime)

    def run(self, stop: threading.Event) -> None:
        while not stop.is_set():
            for job in self.due():
                self.fire(job)  # one at a time: a sweep never overlaps itself
            upcoming = min((j.next_at for j in self.jobs.values()), default=None)
            wait = 60.0 if upcoming is None else (upcoming - self.clock()).total_seconds()
            stop.wait(min(max(wait, 0.05), 60.0))

    def describe(self) -> dict[str, Any]:
        with self._lock:
            return {"jobs": {j.name: {"schedule": j.cron, "next": j.next_at.isoformat(),
                                      "last": dict(j.last)} for j in self.jobs.values()}}


def serve(scheduler: Scheduler, port: int) -> ThreadingHTTPServer:
    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            body = json.dumps(scheduler.describe()).encode()
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, format: str, *args: Any) -> None:
            return

    return ThreadingHTTPServer(("127.0.0.1", port), Handler)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m stack.scheduler")
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--functions-url", required=True)
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, stream=sys.stderr,
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    scheduler = Scheduler(args.functions_url, schedules())
    for job in scheduler.jobs.values():
        log.info("%s: %s (next %s)", job.name, job.cron, job.next_at.isoformat())
    stop = threading.Event()
    threading.Thread(target=scheduler.run, args=(stop,), daemon=True, name="scheduler").start()
    server = serve(scheduler, args.port)
    try:
        server.serve_forever()
    finally:
        stop.set()


if __name__ == "__main__":
    main()
