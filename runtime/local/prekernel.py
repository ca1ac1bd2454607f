"""A warm kernel: an interpreter that has imported ipykernel and waits to become one
workspace's kernel.

    python -m runtime.local.prekernel

Most of a kernel's start is Python starting and importing ipykernel, IPython, and what a
restore's kernel imports (the in-kernel snapshot agent, numpy); none of that depends on
whose kernel it is. So the node agent keeps a few of these per environment beside the warm
servers (``runtime.local.warm``, ``environments[].warm_kernels``). Each has imported that
and blocks on one line of stdin. It has bound no port, read no connection file and no
file of any workspace, and runs nobody's code: it has served nobody.

It becomes a workspace's in two steps, each taken once:

1. **Hand-over** (the agent, at that workspace's provision or resume: one line of stdin,
   then end of stdin)::

       {"log": PATH, "runtime_dir": DIR, "cwd": HOME, "env": {...}, "server_pid": N,
        "memory_bytes": N | null, "cpus": [0, 1] | null, "uid": N | null}

   It sends its output to the workspace's log, applies the workspace's limits, drops to
   the workspace's user when it has one (setgroups, setgid, setuid, as the warm server
   does), replaces its environment, moves to the home, ends itself when the workspace's
   server ends (a pidfd: claimed or not, it never outlives the start it was handed to),
   and then offers itself in the workspace's runtime dir (0700, the workspace's): a FIFO
   ``stasis-warm-kernel.fifo`` and, written last, ``stasis-warm-kernel.json`` (its pid,
   interpreter, and the top-level modules it has imported).
2. **Claim** (the workspace's own jupyter-server, through the kernel provisioner
   ``runtime.local.kernel_provisioner``, for the first kernel it starts): the provisioner
   renames the offer away (only one rename succeeds, so it is claimed at most once) and
   writes one JSON line into the FIFO: the kernel command, environment and cwd that
   jupyter-server would have given a cold kernel, and the server's pid. The kernel then
   takes that environment and cwd, makes the command's interpreter (the home's venv) its
   ``sys.executable`` and puts the venv's site-packages where a cold kernel's path has
   them, and runs ``IPKernelApp`` on the connection file the manager wrote. (The pidfd on
   the server is what ipykernel's parent poller is for a cold kernel, whose parent the
   server is; this one's parent is the agent.)

End of stdin before a hand-over (the agent stopped or let it go) ends it with nothing
done. Handed over and never claimed (the workspace opened no notebook), it waits until
the workspace's server stops, which ends it.
"""

from __future__ import annotations

import contextlib
import json
import os
import select
import sys
import threading
from pathlib import Path
from typing import Any

from runtime.local.prewarm import READY_VAR

OFFER = "stasis-warm-kernel.json"
FIFO = "stasis-warm-kernel.fifo"

#: What a kernel's start imports, and what a restore's kernel imports next (the snapshot
#: agent, and numpy where the environment has it).
PRELOAD = (
    "ipykernel.kernelapp",
    "ipykernel.ipkernel",
    "ipykernel.zmqshell",
    "IPython.core.interactiveshell",
    "jupyter_client.session",
    # What IPKernelApp's initialize imports on its own (measured: sys.modules of a started
    # kernel less these): the debugger (the kernel spec has ``debugger: true``: debugpy),
    # IPython's history (sqlite3), completer and inspector.
    "ipykernel.debugger",
    "IPython.core.debugger",
    "IPython.core.completerlib",
    "IPython.core.oinspect",
    "IPython.core.logger",
    "sqlite3",
    "tornado.queues",
    "psutil",
    "runtime.local.launch",
    "runtime.snapshot.inkernel",
    "numpy",
)


def preload() -> list[str]:
    """Import what a kernel imports; the names not installed here. Raises ImportError when
    ipykernel itself is missing (no kernel could start from this interpreter)."""
    import importlib

    missing = []
    for name in PRELOAD:
        try:
            importlib.import_module(name)
        except ImportError:
            if name.startswith("ipykernel.k"):
                raise
            missing.append(name)
    return missing


def imported_tops() -> list[str]:
    """The top-level packages this process has imported from outside the standard library
    (a home venv that shadows one of them cannot take this kernel)."""
    std = set(sys.stdlib_module_names)
    return sorted({name.partition(".")[0] for name in list(sys.modules)}
                  - std - {"__main__", "runtime"})


def hand_over(order: dict[str, Any]) -> tuple[Path, int]:
    """Step 1: become the workspace's (log, limits, user, env, cwd) and offer this kernel
    in its runtime dir; the FIFO's path and this end of it, open before the offer exists
    (so a claim never finds the FIFO without its reader)."""
    from runtime.local.launch import take_over

    null = os.open(os.devnull, os.O_RDONLY)  # the agent's pipe is done with
    os.dup2(null, 0)
    os.close(null)
    take_over(order)
    if order.get("server_pid"):  # a server stopped before it claimed this ends it too
        _end_with(int(order["server_pid"]))
    runtime = Path(order["runtime_dir"])
    fifo = runtime / FIFO
    with contextlib.suppress(FileNotFoundError):
        fifo.unlink()
    os.mkfifo(fifo, 0o600)
    reader = os.open(fifo, os.O_RDWR)  # read-write: opening never blocks, nor reads EOF
    offer = {"pid": os.getpid(), "python": sys.executable, "fifo": str(fifo),
             "imported": imported_tops()}
    partial = runtime / f".{OFFER}.{os.getpid()}"
    partial.write_text(json.dumps(offer))
    partial.chmod(0o600)
    os.replace(partial, runtime / OFFER)
    return fifo, reader


def await_claim(fifo: Path, reader: int) -> dict[str, Any] | None:
    """Step 2: the claim the workspace's server writes into the FIFO (None: an empty
    line)."""
    with os.fdopen(reader, "rb") as stream:  # blocks until the provisioner writes its line
        line = stream.readline()
    with contextlib.suppress(FileNotFoundError):
        fifo.unlink()
    if not line.strip():
        return None
    claim: dict[str, Any] = json.loads(line)
    return claim


def become_kernel(claim: dict[str, Any], imports_set: dict[str, str] | None = None) -> None:
    """Take the kernel's environment, cwd and interpreter from the claim and run
    IPKernelApp on its connection file (returns when the kernel ends). ``imports_set``:
    the variables the preload's imports set (ipykernel's debugger sets
    ``PYDEVD_USE_FRAME_EVAL``), set again on top as a cold kernel's imports would."""
    argv = [str(a) for a in claim["argv"]]
    os.environ.clear()
    os.environ.update({k: str(v) for k, v in claim["env"].items()})
    os.environ.update(imports_set or {})
    os.environ.pop("JPY_PARENT_PID", None)  # not its child: watched by pidfd
    os.chdir(claim["cwd"])
    python = argv[0]
    venv = Path(python).parent.parent
    if (venv / "pyvenv.cfg").exists():
        # Where a cold kernel's path has them: the venv's site-packages (and what their
        # .pth files add) before the first site-packages of the environment.
        import site

        before = list(sys.path)
        for found in sorted(venv.glob("lib/python*/site-packages")):
            site.addsitedir(str(found))
        added = [p for p in sys.path if p not in before]
        at = next((i for i, p in enumerate(before)
                   if os.path.basename(p) in ("site-packages", "dist-packages")), len(before))
        sys.path[:] = before[:at] + added + before[at:]
        sys.prefix = sys.exec_prefix = str(venv)
    sys.executable = python
    if int(claim["server_pid"]) != _watched[0]:
        _end_with(int(claim["server_pid"]))
    sys.argv = [python, *argv[3:]]
    from ipykernel.kernelapp import IPKernelApp

    IPKernelApp.launch_instance(argv=argv[3:])


_watched = [0]


def _end_with(pid: int) -> None:
    """End this process when ``pid`` (the server whose kernel it is) ends."""
    try:
        handle = os.pidfd_open(pid)
    except OSError:
        os._exit(1)
    _watched[0] = pid

    def watch() -> None:
        select.select([handle], [], [])
        os._exit(1)

    threading.Thread(target=watch, name="stasis-server-watch", daemon=True).start()


def main() -> int:
    # As ipykernel_launcher does: the directory it started in is not on the kernel's path.
    if sys.path and sys.path[0] == os.getcwd():
        del sys.path[0]
    before = dict(os.environ)
    missing = preload()
    imports_set = {k: v for k, v in os.environ.items() if before.get(k) != v}
    print(json.dumps({"warm_kernel": True, "missing": missing}), flush=True)
    ready = os.environ.get(READY_VAR)
    if ready:  # the pool counts it from now on
        with open(ready, "w") as marker:
            marker.write(str(os.getpid()))
    line = sys.stdin.readline()
    if not line.strip():
        return 0
    fifo, reader = hand_over(json.loads(line))
    claim = await_claim(fifo, reader)
    if claim is None:
        return 0
    become_kernel(claim, imports_set)
    return 0


if __name__ == "__main__":
    sys.exit(main())
