"""A warm JupyterLab: an interpreter that has imported the server and waits to become one
workspace's server.

    python -m runtime.local.prewarm

Most of a JupyterLab start is Python importing jupyter-server, JupyterLab and their server
extensions (about two thirds of it on this host); none of that depends on who the server is
for. So the node agent keeps a few of these per environment (``runtime.local.warm``): each
has imported what a start imports and then blocks on one line of stdin. It has bound no
port, holds no token, has no home and has read no file of any workspace: it has served
nobody, and it becomes one workspace's server only when the agent hands it that
workspace's launch, once:

    {"argv": [...], "env": {...}, "cwd": HOME, "log": PATH,
     "memory_bytes": N | null, "cpus": [0, 1] | null, "uid": N | null}

It then applies the workspace's limits to itself (as ``runtime.local.launch`` does before
its ``exec``: everything the server starts inherits them), drops to the workspace's own
user when it has one (setgroups, setgid, setuid: the warm process stays the agent's user
until then, and has opened only the log), replaces its environment with the
workspace's (token, home, runtime dir, markers: the kernels it starts get exactly what a
cold start would give them), moves to the home, sends its output to the workspace's log and
runs JupyterLab with the same arguments a cold start gets. End of stdin before a launch (the
agent stopped or let it go) ends it with nothing done.
"""

from __future__ import annotations

import json
import os
import sys
from typing import Any

#: The file this process writes once its imports are done (set by the pool).
READY_VAR = "STASIS_WARM_READY_FILE"

#: What a JupyterLab start imports, beyond the application itself: the server extensions
#: it loads and the modules their ``_load_jupyter_server_extension`` pulls in.
PRELOAD = (
    "jupyterlab.labapp",
    "jupyter_server.serverapp",
    "jupyter_server.services.kernels.kernelmanager",
    "jupyter_server.services.contents.largefilemanager",
    "jupyter_server_terminals",
    "notebook_shim",
    "jupyterlab_server",
    "nbformat",
    "jupyter_client.ioloop",
    "jinja2",
    "tornado.web",
)


def preload() -> list[str]:
    """Import what a start imports; the names that are not installed here (an extension
    this environment lacks is simply not loaded by its server either)."""
    import importlib

    missing = []
    for name in PRELOAD:
        try:
            importlib.import_module(name)
        except ImportError:
            missing.append(name)
    return missing


def become(launch: dict[str, Any]) -> None:
    """Turn this process into the workspace's server (never returns normally)."""
    from runtime.local.launch import take_over

    take_over(launch)
    sys.argv = ["jupyter-lab", *launch["argv"]]
    from jupyterlab.labapp import LabApp

    LabApp.launch_instance(argv=list(launch["argv"]))


def main() -> int:
    missing = preload()
    print(json.dumps({"warm": True, "missing": missing}), flush=True)
    ready = os.environ.get(READY_VAR)
    if ready:  # the pool counts it from now on
        with open(ready, "w") as marker:
            marker.write(str(os.getpid()))
    line = sys.stdin.readline()
    if not line.strip():
        return 0
    become(json.loads(line))
    return 0


if __name__ == "__main__":
    sys.exit(main())
