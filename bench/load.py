"""Sustained load on a local stack of its own, null runtime (prints JSON): ``harness.load``.

Creates ``--workspaces`` workspaces (team ml-a's quota raised to fit), and with ``--local
N`` N more on the local runtime beside them (real JupyterLab servers on this host). Then
for ``--seconds`` publishes ``--rate`` requests a second, pauses and resumes, and prints
per ``--window``: requests sent and done, p50/p99 latency, the function host's memory and
the host's memory in use; at the end, latencies of the null and of the local workspaces
apart. With ``--trace-memory N`` each worker of the function host traces its allocations
(N frames; it slows them) and the JSON says, per worker, the allocation sites that grew
most between the end of the creates and the end of the run.

    .venv/bin/python bench/load.py [--workspaces 200] [--local 10] [--rate 50] [--seconds 600]
                                   [--trace-memory 12]
"""

from __future__ import annotations

import argparse
import json
import os
import sys

from common import private_stack

from harness.load import NULL_MATCH, LoadPlan, run


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--workspaces", type=int, default=200)
    parser.add_argument("--rate", type=float, default=50.0)
    parser.add_argument("--seconds", type=float, default=600.0)
    parser.add_argument("--window", type=float, default=60.0)
    parser.add_argument("--local", type=int, default=0,
                        help="workspaces on the local runtime beside the null ones")
    parser.add_argument("--trace-memory", type=int, default=0, metavar="FRAMES",
                        help="trace the function host's allocations, FRAMES deep")
    args = parser.parse_args()
    if args.local:
        os.environ["STASIS_NULL_RUNTIME_MATCH"] = NULL_MATCH
    host_env = (lambda _s: {"STASIS_HOST_TRACEMALLOC": str(args.trace_memory)}) \
        if args.trace_memory else None
    plan = LoadPlan(workspaces=args.workspaces, rate=args.rate, seconds=args.seconds,
                    window=args.window, local=args.local, trace_memory=bool(args.trace_memory))
    with private_stack("local" if args.local else "null", host_env=host_env) as (
            settings, _report):
        report = run(settings, plan, say=lambda line: print(line, file=sys.stderr))
    print(json.dumps(report, indent=1))


if __name__ == "__main__":
    main()
