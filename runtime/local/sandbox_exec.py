"""Exec trampoline of a sandbox: isolate this process, limit it, drop privileges, exec.

    python -I runtime/local/sandbox_exec.py [--net isolated|host] [--uid N --gid N]
        [--cpu-seconds N] [--memory-bytes N] [--processes N] [--file-bytes N]
        [--hide DIR]... [--keep DIR]... [--cwd DIR] [--cgroup DIR] -- ARGV...
    python -I runtime/local/sandbox_exec.py --probe --port P [--uid N --gid N]
        [--hide DIR --keep DIR]

Run by path with ``-I`` (isolated mode: no PYTHON* variables, no user site, no package
import), so it needs nothing from the scrubbed environment it is started with, and it
imports the standard library only. Why a trampoline and not a ``preexec_fn``: see
``runtime/local/launch.py`` (Python code between fork and exec in a threaded parent can
deadlock); here every step runs in a fresh single-threaded interpreter that then execs.

In order, each step fatal when it fails (exit status 125 and the reason on stderr: a
sandbox is never run with less isolation than its runner asked for):

0. ``--cgroup DIR``: join that cgroup (v1 freezer) before anything else, so the task and
   everything it starts can be frozen as one when it idles (``sandbox_task``); joining
   needs the privileges that are dropped in step 3.
1. ``--net isolated``: a new network namespace whose only interface is loopback, brought
   up; the host's loopback (the emulators, the node agent) and every other network are out
   of reach. As root this is ``unshare(CLONE_NEWNET | CLONE_NEWIPC)``; as another user it
   is a user namespace mapping the user to itself, which owns the network namespace.
2. ``--hide DIR``: a mount namespace of its own (as root ``unshare(CLONE_NEWNS)``, as
   another user inside the user namespace of step 1, or a new one), every mount made
   private so nothing leaks back to the host, then an empty tmpfs over each DIR, remounted
   read-only (nosuid, nodev, noexec): the agent's state and tokens, every workspace's home,
   other sandboxes, the code and the environment the kernels import all look empty and
   cannot be written. A ``--keep DIR`` under a hidden one (the sandbox's own directory)
   is bound back in place (from a descriptor opened before the hiding), with its own
   mounts (the disk quota's tmpfs).
3. rlimits, soft = hard so the task cannot raise them: RLIMIT_CPU (seconds, SIGXCPU then
   SIGKILL five seconds later), RLIMIT_DATA (memory, per process: see launch.py for why
   not RLIMIT_AS), RLIMIT_FSIZE (largest file, the log included), RLIMIT_CORE 0, and
   RLIMIT_NPROC always. It counts the processes of the task's real user: with a user of
   its own (a root agent) that is the sandbox alone; with a non-root agent it is the
   agent's user, so the task gets at most that many processes less what the agent's user
   already runs (it still bounds a fork bomb). Root is exempt from it, which is why a task
   never runs as root.
4. chdir into the working copy, then, as root with ``--uid``, drop to that user and group
   with no supplementary groups: the task cannot read root's files (cloud credentials in
   /root), signal the agent, or re-enter the host's network or mount namespace.
5. PR_SET_NO_NEW_PRIVS, so no setuid binary gives privileges back; then exec.

``--probe`` does steps 1, 2 and 4 (each checked on its own) and checks, from inside, that a
TCP server the prober runs on the host's loopback (``--port``) cannot be reached and that
the host's network namespace cannot be re-entered, and, with ``--hide``, that the hidden
directory's files cannot be read nor a file written there while the kept directory's can
be read; it prints a JSON report. The runner trusts isolation only after it.
"""

from __future__ import annotations

import argparse
import ctypes
import errno
import fcntl
import json
import os
import resource
import socket
import struct
import sys

CLONE_NEWNS = 0x00020000
CLONE_NEWIPC = 0x08000000
CLONE_NEWUSER = 0x10000000
CLONE_NEWNET = 0x40000000
PR_SET_NO_NEW_PRIVS = 38
SIOCGIFFLAGS = 0x8913
SIOCSIFFLAGS = 0x8914
IFF_UP = 0x1
MS_RDONLY = 0x1
MS_NOSUID = 0x2
MS_NODEV = 0x4
MS_NOEXEC = 0x8
MS_REMOUNT = 0x20
MS_BIND = 0x1000
MS_REC = 0x4000
MS_PRIVATE = 0x40000
_HIDDEN_FLAGS = MS_NOSUID | MS_NODEV | MS_NOEXEC
FAILED = 125


class SetupError(Exception):
    """A step of the sandbox setup failed; the task must not run."""


def _libc() -> ctypes.CDLL:
    return ctypes.CDLL(None, use_errno=True)


def _check(result: int, what: str) -> None:
    if result != 0:
        err = ctypes.get_errno()
        raise SetupError(f"{what}: {os.strerror(err)} (errno {errno.errorcode.get(err, err)})")


def _map_user_namespace(uid: int, gid: int) -> None:
    """The new user namespace maps this user to itself and nobody else."""
    try:
        with open("/proc/self/setgroups", "w") as f:
            f.write("deny")
        with open("/proc/self/uid_map", "w") as f:
            f.write(f"{uid} {uid} 1")
        with open("/proc/self/gid_map", "w") as f:
            f.write(f"{gid} {gid} 1")
    except OSError as exc:
        raise SetupError(f"mapping the user namespace: {exc}") from exc


def _in_own_user_namespace() -> bool:
    try:
        return os.readlink("/proc/self/ns/user") != os.readlink("/proc/1/ns/user")
    except OSError:
        return False


def isolate_network() -> None:
    """A fresh network namespace with loopback up (see the module docstring)."""
    uid, gid = os.getuid(), os.getgid()
    flags = CLONE_NEWNET | CLONE_NEWIPC if uid == 0 else CLONE_NEWUSER | CLONE_NEWNET
    _check(_libc().unshare(flags), "unshare (new network namespace)")
    if uid != 0:
        _map_user_namespace(uid, gid)
    try:
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as sock:
            ifreq = struct.pack("16sh22x", b"lo", 0)
            flags_now = struct.unpack("16sh22x", fcntl.ioctl(sock, SIOCGIFFLAGS, ifreq))[1]
            fcntl.ioctl(sock, SIOCSIFFLAGS, struct.pack("16sh22x", b"lo", flags_now | IFF_UP))
    except OSError as exc:
        raise SetupError(f"bringing loopback up in the namespace: {exc}") from exc


def mount(source: str | None, target: str, fstype: str | None, flags: int,
           data: str | None, what: str) -> None:
    libc = _libc()
    libc.mount.argtypes = (ctypes.c_char_p, ctypes.c_char_p, ctypes.c_char_p, ctypes.c_ulong,
                           ctypes.c_char_p)
    encoded = [None if v is None else os.fsencode(v) for v in (source, target, fstype, data)]
    _check(libc.mount(encoded[0], encoded[1], encoded[2], flags, encoded[3]), what)


def private_mount_namespace() -> None:
    """A mount namespace of this process's own, every mount in it private (as root)."""
    _check(_libc().unshare(CLONE_NEWNS), "unshare (new mount namespace)")
    mount(None, "/", None, MS_REC | MS_PRIVATE, None, "making every mount private")


def _outermost(paths: list[str]) -> list[str]:
    """Absolute, symlink-free, existing directories, none inside another."""
    real = sorted({os.path.realpath(p) for p in paths if os.path.isdir(p)})
    return [p for p in real
            if not any(p != q and (p + os.sep).startswith(q.rstrip(os.sep) + os.sep)
                       for q in real)]


def hide_paths(hide: list[str], keep: list[str]) -> None:
    """A mount namespace of its own with an empty read-only tmpfs over every ``hide``
    directory, each ``keep`` directory under one bound back (see the module docstring)."""
    hidden = _outermost(hide)
    if os.sep in hidden:
        # A data dir or code tree at the root would hide the whole system: a mistake.
        raise SetupError("refusing to hide / (a directory to hide resolves to the root)")
    uid, gid = os.getuid(), os.getgid()
    if uid == 0 or _in_own_user_namespace():
        private_mount_namespace()
    else:
        _check(_libc().unshare(CLONE_NEWUSER | CLONE_NEWNS), "unshare (new mount namespace)")
        _map_user_namespace(uid, gid)
        mount(None, "/", None, MS_REC | MS_PRIVATE, None, "making every mount private")
    # Opened before the hiding: afterwards the kept directories are out of reach.
    kept: list[tuple[str, int]] = []
    try:
        for path in keep:
            real = os.path.realpath(path)
            if any((real + os.sep).startswith(h + os.sep) for h in hidden):
                kept.append((real, os.open(real, os.O_PATH | os.O_DIRECTORY)))
    except OSError as exc:
        raise SetupError(f"opening {path} to keep it visible: {exc}") from exc
    try:
        for path in hidden:
            mount("tmpfs", path, "tmpfs", _HIDDEN_FLAGS, "size=64k,mode=0711",
                   f"hiding {path} (tmpfs)")
        for path, fd in kept:
            try:
                os.makedirs(path, mode=0o711, exist_ok=True)
            except OSError as exc:
                raise SetupError(f"making {path} in the hidden tree: {exc}") from exc
            mount(f"/proc/self/fd/{fd}", path, None, MS_BIND | MS_REC, None,
                   f"binding {path} back")
        for path in hidden:
            mount(None, path, None, MS_REMOUNT | MS_BIND | MS_RDONLY | _HIDDEN_FLAGS, None,
                   f"making the tmpfs over {path} read-only")
    finally:
        for _, fd in kept:
            os.close(fd)


def apply_limits(*, cpu_seconds: int | None, memory_bytes: int | None, processes: int | None,
                 file_bytes: int | None) -> None:
    def limit(kind: int, soft: int, hard: int | None = None) -> None:
        try:
            resource.setrlimit(kind, (soft, soft if hard is None else hard))
        except (ValueError, OSError) as exc:
            raise SetupError(f"setrlimit({kind}, {soft}): {exc}") from exc

    limit(resource.RLIMIT_CORE, 0)
    if cpu_seconds:
        limit(resource.RLIMIT_CPU, cpu_seconds, cpu_seconds + 5)
    if memory_bytes:
        limit(resource.RLIMIT_DATA, memory_bytes)
    if file_bytes:
        limit(resource.RLIMIT_FSIZE, file_bytes)
    if processes:
        limit(resource.RLIMIT_NPROC, processes)


def drop_privileges(uid: int, gid: int) -> None:
    try:
        os.setgroups([])
        os.setgid(gid)
        os.setuid(uid)
    except OSError as exc:
        raise SetupError(f"dropping to uid {uid}: {exc}") from exc
    if os.getuid() != uid or os.geteuid() != uid:
        raise SetupError(f"still uid {os.geteuid()} after dropping to {uid}")


def join_cgroup(directory: str) -> None:
    try:
        with open(os.path.join(directory, "cgroup.procs"), "w") as f:
            f.write(str(os.getpid()))
    except OSError as exc:
        raise SetupError(f"joining cgroup {directory}: {exc}") from exc


def no_new_privileges() -> None:
    _check(_libc().prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0), "prctl(PR_SET_NO_NEW_PRIVS)")


def _hidden_problem(hidden: str, kept: str) -> str | None:
    """Why ``hidden`` is not hidden from this process while ``kept`` (a directory under it
    with a file ``marker``) stays visible; None when it is. The prober left a readable
    file ``secret`` in ``hidden``."""
    try:
        with open(os.path.join(hidden, "secret"), "rb"):
            return f"a file in the hidden {hidden} was readable from inside"
    except OSError:
        pass
    try:
        names = set(os.listdir(hidden))
    except OSError:
        names = set()
    path_to_kept = os.path.relpath(kept, hidden).split(os.sep)[0]
    if names - {path_to_kept}:
        return f"{hidden} still shows {sorted(names - {path_to_kept})[:3]} from inside"
    try:
        with open(os.path.join(kept, "marker"), "rb"):
            pass
    except OSError as exc:
        return f"the kept directory {kept} was not readable from inside ({exc})"
    try:
        fd = os.open(os.path.join(hidden, "planted"), os.O_WRONLY | os.O_CREAT, 0o644)
    except OSError:
        return None
    os.close(fd)
    return f"a file could be written into the hidden {hidden}"


def probe(port: int, uid: int | None, gid: int | None, hide: list[str] | None = None,
          keep: list[str] | None = None) -> dict[str, object]:
    """Isolate, drop, and check from inside what the task will be able to reach. The
    network, the mount namespace and the user drop are probed separately: a namespace
    that cannot be made does not stop the others from being tested (``user``: True, False
    with ``user_why``, or None when no drop was asked; ``mounts`` likewise with
    ``mounts_why``, None without ``--hide``), so none is ever assumed from another."""
    report: dict[str, object] = {"uid": os.getuid(), "user": None, "mounts": None}
    try:
        isolate_network()
        network_error = None
    except SetupError as exc:
        network_error = str(exc)
    mounts_error = None
    if hide:
        try:
            hide_paths(hide, keep or [])
        except SetupError as exc:
            mounts_error = str(exc)
    if uid is not None and gid is not None:
        try:
            drop_privileges(uid, gid)
            report["user"] = True
        except SetupError as exc:
            report.update(user=False, user_why=str(exc))
    report["uid"] = os.getuid()
    if hide:
        mounts_error = mounts_error or _hidden_problem(hide[0], (keep or [hide[0]])[0])
        report.update(mounts=mounts_error is None)
        if mounts_error is not None:
            report["mounts_why"] = mounts_error
    try:
        no_new_privileges()
    except SetupError as exc:
        network_error = network_error or str(exc)
    if network_error is not None:
        report.update(network=False, why=network_error)
        return report
    try:
        # A bytes host: after the drop the standard library may be unreadable (a Python
        # installed under /root), and a str host needs the idna codec imported lazily.
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
            sock.settimeout(2)
            sock.connect((b"127.0.0.1", port))
        report.update(network=False, why=f"the host's loopback port {port} was reachable "
                                         "from inside the namespace")
        return report
    except OSError as exc:
        report["host_loopback"] = f"unreachable ({exc.strerror or exc})"
    # Re-entering the host's namespace needs CAP_SYS_ADMIN over it: must be refused.
    try:
        fd = os.open("/proc/1/ns/net", os.O_RDONLY)
        try:
            result = _libc().setns(fd, CLONE_NEWNET)
        finally:
            os.close(fd)
        if result == 0:
            report.update(network=False, why="the host's network namespace could be "
                                             "re-entered (setns succeeded)")
            return report
        report["setns"] = os.strerror(ctypes.get_errno())
    except OSError as exc:
        report["setns"] = exc.strerror or str(exc)
    report["network"] = True
    return report


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="sandbox_exec")
    parser.add_argument("--net", choices=("isolated", "host"), default="isolated")
    parser.add_argument("--uid", type=int, default=None)
    parser.add_argument("--gid", type=int, default=None)
    parser.add_argument("--cpu-seconds", type=int, default=None)
    parser.add_argument("--memory-bytes", type=int, default=None)
    parser.add_argument("--processes", type=int, default=None)
    parser.add_argument("--file-bytes", type=int, default=None)
    parser.add_argument("--cwd", default=None)
    parser.add_argument("--cgroup", default=None)
    parser.add_argument("--hide", action="append", default=[])
    parser.add_argument("--keep", action="append", default=[])
    parser.add_argument("--probe", action="store_true")
    parser.add_argument("--port", type=int, default=0)
    parser.add_argument("command", nargs=argparse.REMAINDER)
    args = parser.parse_args(argv)
    if (args.uid is None) != (args.gid is None):
        parser.error("--uid and --gid go together")
    if args.probe:
        print(json.dumps(probe(args.port, args.uid, args.gid, args.hide, args.keep)),
              flush=True)
        return 0
    command = args.command[1:] if args.command[:1] == ["--"] else args.command
    if not command:
        parser.error("no command to run after --")
    try:
        if args.cgroup:
            join_cgroup(args.cgroup)
        if args.net == "isolated":
            isolate_network()
        if args.hide:
            hide_paths(args.hide, args.keep)
        apply_limits(cpu_seconds=args.cpu_seconds, memory_bytes=args.memory_bytes,
                     processes=args.processes,
                     file_bytes=args.file_bytes)
        if args.cwd:
            os.chdir(args.cwd)
        if args.uid is not None:
            drop_privileges(args.uid, args.gid)
        no_new_privileges()
        os.umask(0o022)
    except SetupError as exc:
        print(f"sandbox setup failed, the task did not run: {exc}", file=sys.stderr, flush=True)
        return FAILED
    sys.stdout.flush()
    sys.stderr.flush()
    try:
        os.execvp(command[0], command)
    except OSError as exc:
        print(f"sandbox: cannot execute {command[0]!r}: {exc}", file=sys.stderr, flush=True)
        return 127
    return FAILED  # unreachable: exec replaced this process


if __name__ == "__main__":
    sys.exit(main())
