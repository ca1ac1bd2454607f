"""What the Kubernetes code costs a cold start: import times of its modules (prints JSON).

A deployed function imports a Kubernetes runtime on its first event when
``STASIS_RUNTIME=kubernetes`` (``functions.bootstrap``); the cluster monitor imports its
watchers at start. Each module is imported in a fresh interpreter, ``--runs`` times, after
what every function imports anyway (``events``, ``functions.ports``, the domain's catalog
and sandboxes), and the CPU time of that import is taken: the Kubernetes code's own cost.
Also reports whether the ``kubernetes`` client was imported (it should not be:
``api.KubeApi`` imports it on the first call).

    .venv/bin/python bench/k8s_cold_start.py [--runs 7] [--root DIR MODULE...]

``--root`` times another checkout (an export of an older commit, say) and its module names.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from pathlib import Path

from common import summary

ROOT = Path(__file__).resolve().parents[1]
ALREADY = "import events, functions.ports, functions.domain.catalog, functions.domain.sandboxes"
MODULES = (
    "functions.kubernetes.objects.workspace",
    "functions.kubernetes.workspaces",
    "functions.kubernetes.sandboxes",
    "functions.kubernetes.jobs",
    "runtime.kubernetes.monitor",
)


def import_ms(module: str, root: Path = ROOT) -> tuple[float, bool]:
    """CPU time (ms) to import ``module`` in a fresh interpreter, and whether the
    ``kubernetes`` client came with it. CPU time, not wall time: on a shared machine a
    process waiting for a core would count the wait."""
    code = (f"{ALREADY}; import sys, time; began = time.process_time(); import {module}; "
            "print((time.process_time() - began) * 1000, 'kubernetes' in sys.modules)")
    done = subprocess.run([sys.executable, "-c", code], cwd=root, capture_output=True,
                          text=True, check=True, env={**os.environ, "PYTHONPATH": str(root)})
    ms, client = done.stdout.split()
    return float(ms), client == "True"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=7)
    parser.add_argument("--root", type=Path, default=ROOT)
    parser.add_argument("modules", nargs="*", default=MODULES)
    args = parser.parse_args()
    times: dict[str, list[float]] = {m: [] for m in args.modules}
    client = dict.fromkeys(args.modules, False)
    for _ in range(args.runs):  # round robin: a busy moment slows every module alike
        for module in args.modules:
            ms, loaded = import_ms(module, args.root)
            times[module].append(ms)
            client[module] |= loaded
    print(json.dumps({m: {"import_ms": summary(times[m]), "min_ms": round(min(times[m]), 1),
                          "imports_kubernetes_client": client[m]} for m in args.modules},
                     indent=1))


if __name__ == "__main__":
    main()
