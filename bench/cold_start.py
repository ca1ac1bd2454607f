"""What a function instance pays before its first request: importing ``functions.main``.

Every deployed function loads the same ``main.py``, which builds its entry points from
``functions/routes.py`` (so it imports every handler module) and builds no client. Each run
is a fresh interpreter; CPU time is the figure to compare (wall time moves with the load of
a shared machine). The slowest imports of the last run are listed (``-X importtime``, self
time), which says where the time goes.

    python bench/cold_start.py [--runs 10] [--source DIR]   # DIR: another checkout
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path

from common import summary

ROOT = Path(__file__).resolve().parent.parent
PROBE = ("import time\nw, c = time.perf_counter(), time.process_time()\nimport functions.main\n"
         "print(time.process_time() - c, time.perf_counter() - w)\n")


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--runs", type=int, default=10)
    parser.add_argument("--source", type=Path, default=ROOT)
    args = parser.parse_args()
    cpu, wall = [], []
    for _ in range(args.runs):
        out = subprocess.run([sys.executable, "-c", PROBE], cwd=args.source, check=True,
                             capture_output=True, text=True).stdout.split()
        cpu.append(float(out[0]) * 1000)
        wall.append(float(out[1]) * 1000)
    trace = subprocess.run([sys.executable, "-X", "importtime", "-c", "import functions.main"],
                           cwd=args.source, check=True, capture_output=True, text=True).stderr
    selfs = []
    for line in trace.splitlines()[1:]:
        parts = line.removeprefix("import time:").split("|")
        if len(parts) == 3 and parts[0].strip().isdigit():
            selfs.append((int(parts[0]) / 1000, parts[2].strip()))
    print(json.dumps({
        "source": str(args.source),
        "import_functions_main_cpu_ms": summary(cpu),
        "import_functions_main_wall_ms": summary(wall),
        "slowest_self_ms": {name: round(ms, 1) for ms, name in sorted(selfs)[-8:][::-1]},
    }, indent=2))


if __name__ == "__main__":
    main()
