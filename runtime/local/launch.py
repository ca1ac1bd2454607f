"""Exec trampoline: apply a workspace's limits to this process, then become its server.

    python -m runtime.local.launch [--memory-bytes N] [--cpus 0,1] -- ARGV...

Limits set here are inherited by everything the server starts (kernels, terminals,
their children), which is the point. Why a trampoline and not a ``preexec_fn``: the agent
is multi-threaded (HTTP threads, operation threads, the gRPC threads of the Pub/Sub
client), and Python code between ``fork`` and ``exec`` in a threaded process can deadlock
on a lock another thread held at fork time. Here the limits are set in a fresh
single-threaded interpreter that then ``exec``s, keeping its pid, so the agent's record of
the server stays true.

Memory is held with ``RLIMIT_DATA`` (private writable memory: the heap and anonymous
mappings), not ``RLIMIT_AS``: address-space limits count every thread's reserved stack and
allocator arenas, and a kernel under a 1 GiB ``RLIMIT_AS`` cannot even start the threads
ipykernel and OpenBLAS need, while under ``RLIMIT_DATA`` normal work runs and an
allocation beyond the limit raises ``MemoryError`` in the kernel, which survives it. Both
soft and hard limits are set, so the workspace cannot raise them. The limit is per
process (a cgroup would hold the total; rlimits are what an unprivileged agent has).

``--user UID`` (a root agent's isolated workspace, ``runtime.local.tenancy``) drops to that
uid and gid with no supplementary groups after the limits, before the ``exec``.
"""

from __future__ import annotations

import argparse
import os
import resource
import sys
from typing import Any


def apply_limits(memory_bytes: int | None, cpus: list[int] | None) -> None:
    if memory_bytes:
        resource.setrlimit(resource.RLIMIT_DATA, (memory_bytes, memory_bytes))
    if cpus:
        os.sched_setaffinity(0, cpus)


def become_user(uid: int) -> None:
    """Drop to ``uid`` (gid ``uid``, no supplementary groups) for good: the workspace's
    own user (``runtime.local.tenancy``). Raises OSError when the drop did not hold."""
    os.setgroups([])
    os.setgid(uid)
    os.setuid(uid)
    if os.getuid() != uid or os.geteuid() != uid or os.getgid() != uid:
        raise OSError(f"still uid {os.geteuid()} after dropping to {uid}")


def take_over(order: dict[str, Any]) -> None:
    """A warm process (``prewarm``, ``prekernel``) becomes a workspace's: its output to the
    workspace's log, the workspace's limits, its user (before any of its files), its
    environment and its home, as a cold start's ``exec`` would have them."""
    log_fd = os.open(str(order["log"]), os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
    os.dup2(log_fd, 1)
    os.dup2(log_fd, 2)
    os.close(log_fd)
    apply_limits(order.get("memory_bytes"), order.get("cpus"))
    if order.get("uid") is not None:
        become_user(int(order["uid"]))
    os.environ.clear()
    os.environ.update(order["env"])
    os.chdir(str(order["cwd"]))


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m runtime.local.launch")
    parser.add_argument("--memory-bytes", type=int, default=None)
    parser.add_argument("--cpus", default="", help="comma-separated CPU ids")
    parser.add_argument("--user", type=int, default=None,
                        help="run as this uid and gid, without supplementary groups")
    parser.add_argument("command", nargs=argparse.REMAINDER)
    args = parser.parse_args(argv)
    command = args.command[1:] if args.command[:1] == ["--"] else args.command
    if not command:
        parser.error("no command to run after --")
    cpus = [int(c) for c in args.cpus.split(",") if c.strip()] or None
    apply_limits(args.memory_bytes, cpus)
    if args.user is not None:
        become_user(args.user)
    sys.stdout.flush()
    sys.stderr.flush()
    os.execvp(command[0], command)


if __name__ == "__main__":
    main()
