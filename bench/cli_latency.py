"""How long the `stasis` command takes, run as a user runs it (prints JSON).

Starts a private local stack (null runtime) on free ports, then runs the installed console
script ``stasis`` as a new process for each sample, with only the ``STASIS_*`` variables a
user would set: ``stasis --help``, ``stasis ws list`` and ``stasis ws create NAME --team
ml-a`` (without ``--wait``: the time for the control plane's ``cli`` function to preview and
publish the request; ml-a's workspace quota is raised first so that every sample passes the
preview). For each: wall time (p50, min, max, seconds) and the CPU time the process used.
Then one run of each under ``python -X importtime``: the import time in total and the
packages that cost the most, which is what dominates a short command.

Targets (issue 20): ws list <= 0.3 s, ws create <= 0.5 s.

    .venv/bin/python bench/cli_latency.py [--runs 7] [--stasis "PYTHON -m stack"]

``--stasis`` is how to run the command (default: this Python running the ``stasis``
console script beside it), so that another checkout (an older layout) can be measured
the same way from its own directory.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import shlex
import subprocess
import sys
import time
from pathlib import Path

from common import private_stack

from functions.bootstrap import CATALOG_TTL_SECONDS
from stack.settings import Settings

EXAMPLE = Path(__file__).resolve().parents[1] / "examples" / "stasis.yaml"

STASIS = Path(sys.executable).with_name("stasis")
#: Variables that would point a client at emulators: a user's shell has none of them.
_CLIENT_VARS = ("FIRESTORE_EMULATOR_HOST", "PUBSUB_EMULATOR_HOST", "STORAGE_EMULATOR_HOST",
                "GOOGLE_CLOUD_PROJECT")


def _user_env(settings: Settings) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items()
           if not k.startswith("STASIS_") and k not in _CLIENT_VARS}
    env.update({"STASIS_DATA_DIR": str(settings.data_dir), "STASIS_PROJECT": settings.project,
                **{f"STASIS_{name.upper()}_PORT": str(port)
                   for name, port in settings.ports().items()}})
    return env


def _timed(argv: list[str], env: dict[str, str]) -> tuple[float, float]:
    """(wall seconds, CPU seconds) of one run; fails loudly if the command fails."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    began = time.perf_counter()
    done = subprocess.run(argv, env=env, capture_output=True, text=True, check=False)
    wall = time.perf_counter() - began
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    if done.returncode != 0:
        raise SystemExit(f"{' '.join(argv)} exited {done.returncode}:\n{done.stdout}"
                         f"{done.stderr}")
    return wall, (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)


def _importtime(argv: list[str], env: dict[str, str], top: int = 8) -> dict[str, object]:
    """Total import time of one run and the packages that cost the most, in ms: each
    module's own time (``-X importtime``'s SELF column) summed by its top-level package, so
    ``google`` counts the Google Cloud clients wherever they were imported from."""
    done = subprocess.run([argv[0], "-X", "importtime", *argv[1:]], env=env,
                          capture_output=True, text=True, check=False)
    roots: dict[str, int] = {}
    total = 0
    for line in done.stderr.splitlines():
        parts = line.removeprefix("import time:").split("|")
        if not line.startswith("import time:") or len(parts) != 3 or not parts[0].strip().isdigit():
            continue
        total += int(parts[0])
        root = parts[2].strip().split(".")[0]
        roots[root] = roots.get(root, 0) + int(parts[0])
    ranked = sorted(roots.items(), key=lambda kv: kv[1], reverse=True)[:top]
    return {"total_ms": round(total / 1000), "top_ms": {k: round(v / 1000) for k, v in ranked}}


def _room_for(stasis: list[str], env: dict[str, str], workspaces: int, where: Path) -> None:
    """ml-a may hold ``workspaces`` more than the example allows, and the function host's
    catalog has been re-read since."""
    import yaml

    admin = yaml.safe_load(EXAMPLE.read_text())
    team = next(t for t in admin["teams"] if t["id"] == "ml-a")
    team["quotas"]["workspaces"] += workspaces
    applied = where / "bench-room.yaml"
    applied.write_text(yaml.safe_dump(admin))
    subprocess.run([*stasis, "admin", "apply", str(applied)], env=env, check=True,
                   capture_output=True)
    time.sleep(CATALOG_TTL_SECONDS + 0.5)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--runs", type=int, default=7)
    parser.add_argument("--stasis", default=f"{sys.executable} {STASIS}",
                        help="The command line that runs `stasis` (a Python first).")
    args = parser.parse_args()
    stasis = shlex.split(args.stasis)
    with private_stack() as (settings, _):
        env = _user_env(settings)
        _room_for(stasis, env, args.runs + 2, Path(settings.data_dir))
        commands = {
            "help": lambda i: [*stasis, "--help"],
            "ws list": lambda i: [*stasis, "ws", "list"],
            "ws create": lambda i: [*stasis, "ws", "create", f"bench-{i}", "--team", "ml-a"],
        }
        report: dict[str, object] = {"runs": args.runs}
        for label, argv_of in commands.items():
            _timed(argv_of(100), env)  # warm the page cache once
            samples = [_timed(argv_of(i), env) for i in range(args.runs)]
            walls = sorted(w for w, _ in samples)
            cpus = sorted(c for _, c in samples)
            report[label] = {
                "wall_s": {"p50": round(walls[len(walls) // 2], 3), "min": round(walls[0], 3),
                           "max": round(walls[-1], 3)},
                "cpu_s_p50": round(cpus[len(cpus) // 2], 3),
                "imports": _importtime(argv_of(200), env),
            }
        report["targets_s"] = {"ws list": 0.3, "ws create": 0.5}
        print(json.dumps(report, indent=2))


if __name__ == "__main__":
    main()
