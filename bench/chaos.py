"""Faults on purpose on a local stack of its own (prints JSON): ``harness.chaos``.

Workspaces cycle create -> cell -> pause -> resume -> check -> delete while the function
host (two workers) and the node agent are killed with SIGKILL and started again, the
Firestore and Pub/Sub emulators and fake-gcs-server stalled with SIGSTOP, and crash points
armed; then the invariants are checked. Prints operations by kind (with latencies), faults
by kind, restarts, crash points that fired, requests lost and invariant violations (both
must be 0), and whether anything of the stack outlived `stasis down`.

    .venv/bin/python bench/chaos.py [--seed 7] [--seconds 600] [--workspaces 4]
        [--fault-every 6] [--max-stall 30]
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from pathlib import Path

import psutil
from common import private_stack

from events import crashpoints
from harness.chaos import Chaos, HostPaths, Plan, our_processes


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seed", type=int, default=7)
    parser.add_argument("--seconds", type=float, default=600.0)
    parser.add_argument("--workspaces", type=int, default=4)
    parser.add_argument("--fault-every", type=float, default=6.0)
    parser.add_argument("--max-stall", type=float, default=30.0)
    args = parser.parse_args()
    crash_dir = Path(tempfile.mkdtemp()) / "crash"
    os.environ[crashpoints.ENV] = str(crash_dir)
    plan = Plan(seed=args.seed, seconds=args.seconds, workspaces=args.workspaces,
                fault_every=args.fault_every, max_stall=args.max_stall)
    paths = HostPaths()
    with private_stack("local", host_env=paths.env) as (settings, _report):
        os.environ["STASIS_PROJECT"] = settings.project
        chaos = Chaos(settings, crash_dir, plan, say=lambda m: print(m, file=sys.stderr),
                      paths=paths)
        report = chaos.run()
        pids = our_processes(settings)
    paths.close()
    time.sleep(1.0)
    report["left_after_down"] = [p for p in pids if psutil.pid_exists(p)
                                 and psutil.Process(p).status() != psutil.STATUS_ZOMBIE]
    print(json.dumps(report, indent=1))
    sys.exit(1 if report["violations"] or report["requests_lost"]
             or report["left_after_down"] else 0)


if __name__ == "__main__":
    main()
