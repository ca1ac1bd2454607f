"""The monitor of one sandbox: prepare, run, watch, collect, upload, report.

    python -m runtime.local.sandbox_task DIR

The node agent starts one monitor per sandbox, in a session of its own, and reads
``DIR/result.json`` when it exits (the agent publishes sandbox.finished). The monitor
outlives an agent restart, so a task keeps running while the agent is away; a restarted
agent finds the result (or the monitor still running) and reports it.

``DIR`` (owned by the agent's user, mode 0711) holds what the runner wrote and what the
monitor writes; the task cannot touch any of it:

    spec.json     the sandbox (see ``runtime.local.sandboxes``)
    log.txt       a header, the task's stdout and stderr, a footer saying how it ended
    patch.diff    ``git add -A`` then ``git diff --binary <base sha>`` of the working copy
    result.json   the sandbox.finished payload
    suspended.json  the latest idle suspension: its sandbox.suspended payload and whether
                  it is held now (the agent publishes it, and signals a resume)
    checkpoint-N.diff  the diff at the N-th suspension
    disk/         the sandbox's disk: a tmpfs of ``limits.disk_bytes`` (see below)
    disk/work/ disk/home/ disk/tmp/   the working copy, $HOME and $TMPDIR, owned by the
                  sandbox's user

Steps:

0. **Disk quota** (``spec["disk_quota"]``, a root agent whose probe verified mount
   namespaces): the monitor makes a mount namespace of its own (every mount private) and
   mounts a tmpfs of ``limits.disk_bytes`` on ``disk/``, so the working copy, home and
   temporary files together hold at most that much: past it a write fails with ENOSPC,
   the task's other files and its patch are kept, and the host's disk is not touched
   (tmpfs pages live in memory and swap: the quota is also memory the host must have).
   Only the monitor and the processes it starts see that tmpfs; it vanishes with the
   monitor, whatever way it ends (no mount is ever left on the host). Without it (a
   non-root agent, or unisolated sandboxes allowed on a host without mount namespaces)
   ``disk/`` is a plain directory and only RLIMIT_FSIZE bounds each file; the log says so.
1. **Working copy**: ``git clone --no-hardlinks`` of the repository (a local path or a URL
   the agent can reach), the base ref resolved to a commit and checked out detached, the
   ``origin`` remote removed (a sandbox returns a patch; it never pushes), and everything
   handed to the sandbox's user.
2. **Run** ``/bin/sh -c COMMAND`` through ``sandbox_exec`` (network namespace, rlimits,
   privilege drop) with a scrubbed environment (``scrubbed_env``). The monitor is a child
   subreaper, so every process of the task stays its descendant even after a double fork;
   it samples them every 100 ms and kills them all (SIGKILL, repeated until none is left)
   when the wall clock, the total CPU time or the total resident memory passes its limit.
   Per-process rlimits back this up between samples.
3. **Collect** the patch as the sandbox's user (``git`` runs under the same isolation: the
   task may have rewritten the repository's config and hooks, so nothing of the working
   copy ever runs with the agent's privileges). Its index and the objects ``git add``
   writes go to a directory of the monitor's outside the quota, so a full disk still
   gives its patch.
4. **Upload** patch, log and result to ``gs://BUCKET/PREFIX/`` and delete the working copy.

**Idle**: with ``limits.idle_seconds`` (0: never), a task whose processes use no CPU time,
read or write nothing and start or end no process for that long is suspended. CRIU does
not work on every kernel (not on the one this was built on: "vdso: Unexpected rt vDSO
area bounds"), so nothing is written to storage but the diff: the process tree is
*frozen* (a cgroup v1 freezer cgroup of its own when the monitor can make one, else
SIGSTOP to every process), which releases its CPU, while its memory STAYS RESIDENT. The
diff so far is uploaded as ``checkpoint-N.diff`` (taken with an index file of its own, so
the task's index is untouched), ``suspended.json`` is written for the agent to publish,
and the monitor waits for SIGUSR1 (resume) or SIGTERM (cancel: thawed, then killed as
usual). Suspended time counts neither against the wall clock nor, the checkpoint's git
included, against the CPU time.
"""

from __future__ import annotations

import contextlib
import ctypes
import hashlib
import json
import os
import resource
import shutil
import signal
import stat
import subprocess
import sys
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import psutil

from runtime.local.sandbox_exec import (
    MS_NODEV,
    MS_NOSUID,
    SetupError,
    mount,
    private_mount_namespace,
)
from runtime.supervisor import is_live, write_json

EXEC_PATH = Path(__file__).resolve().with_name("sandbox_exec.py")
FREEZER_ROOT = Path("/sys/fs/cgroup/freezer")
CHECKPOINT_TIMEOUT = 120.0
PR_SET_CHILD_SUBREAPER = 36
PR_SET_DUMPABLE = 4
SETUP_FAILED_EXIT = 125
SETUP_FAILED_TEXT = b"sandbox setup failed, the task did not run"
SAMPLE_SECONDS = 0.1
CLONE_TIMEOUT = 300.0
COLLECT_TIMEOUT = 120.0
#: Largest file the task may write (the log included) and largest patch collected.
FILE_BYTES = 1 << 30
PATCH_BYTES = 256 << 20
#: The disk quota of a spec from a control plane before quotas (the domain's default).
DISK_BYTES = 2 << 30
_MEMORY_WORDS = (b"MemoryError", b"Cannot allocate memory", b"std::bad_alloc")
#: Variables of the host a sandbox may see; everything else (cloud credentials, tokens,
#: SSH agents, proxies with passwords in them) stays out.
ALLOWED_HOST_VARS = ("LANG", "LC_ALL", "TZ")


class PrepareError(Exception):
    """The working copy could not be made: the task never ran."""


def scrubbed_env(*, sandbox_id: str, home: str, tmp: str, path: str,
                 host: Mapping[str, str]) -> dict[str, str]:
    """The task's whole environment: an allow-list, never the agent's environment minus
    a deny-list (a new credential variable must not leak because nobody listed it)."""
    env = {k: host[k] for k in ALLOWED_HOST_VARS if host.get(k)}
    env.setdefault("LANG", "C.UTF-8")
    env.update({
        "PATH": path,
        "HOME": home,
        "TMPDIR": tmp,
        "USER": "sandbox",
        "LOGNAME": "sandbox",
        "SHELL": "/bin/sh",
        "TERM": "dumb",
        "STASIS_SANDBOX_ID": sandbox_id,
        # Commits made by the task are fine (the patch is taken against the base); they
        # need an identity, and must not invent the agent user's.
        "GIT_AUTHOR_NAME": "stasis sandbox",
        "GIT_AUTHOR_EMAIL": "sandbox@stasis.invalid",
        "GIT_COMMITTER_NAME": "stasis sandbox",
        "GIT_COMMITTER_EMAIL": "sandbox@stasis.invalid",
        "GIT_TERMINAL_PROMPT": "0",
        # No __pycache__ in the patch of a repository that does not ignore it.
        "PYTHONDONTWRITEBYTECODE": "1",
    })
    return env


def exec_argv(spec: Mapping[str, Any], argv: Sequence[str], *, cwd: str,
              cpu_seconds: int, memory_bytes: int, file_bytes: int,
              net: str | None = None, cgroup: Path | None = None) -> list[str]:
    """The trampoline's command line for ``argv`` under the sandbox's isolation."""
    out = [str(spec.get("python") or sys.executable), "-I", str(EXEC_PATH),
           "--net", net or spec["net"], "--cwd", cwd,
           "--cpu-seconds", str(cpu_seconds), "--memory-bytes", str(memory_bytes),
           "--file-bytes", str(file_bytes), "--processes", str(spec["limits"]["processes"])]
    if cgroup is not None:
        out += ["--cgroup", str(cgroup)]
    for path in spec.get("hide") or ():
        out += ["--hide", str(path)]
    for path in spec.get("keep") or ():
        out += ["--keep", str(path)]
    if spec.get("uid") is not None:
        out += ["--uid", str(spec["uid"]), "--gid", str(spec["gid"])]
    return [*out, "--", *argv]


@dataclass
class Watch:
    """What the watchdog saw of one run."""

    status: int | None = None  # wait status of the direct child
    stopped: str | None = None  # termination decided by the watchdog
    peak_memory_bytes: int = 0
    cpu_seconds: float = 0.0
    seconds: float = 0.0  # run time, suspended time not counted
    suspended_seconds: float = 0.0
    suspensions: int = 0
    notes: list[str] = field(default_factory=list)

    @property
    def exit_status(self) -> int | None:
        """Shell convention: the code, or 128 + the signal that ended it."""
        if self.status is None:
            return None
        if os.WIFEXITED(self.status):
            return os.WEXITSTATUS(self.status)
        if os.WIFSIGNALED(self.status):
            return 128 + os.WTERMSIG(self.status)
        return None


def classify(watch: Watch, limits: Mapping[str, int], log_tail: bytes) -> tuple[str, str | None]:
    """(termination, error) of a run: the watchdog's verdict first, then the exit."""
    if watch.stopped == "wall_clock_exceeded":
        return watch.stopped, (f"wall clock limit of {limits['wall_clock_seconds']} s "
                               "exceeded; every process of the sandbox was killed")
    if watch.stopped == "cpu_time_exceeded":
        return watch.stopped, (f"CPU time limit of {limits['cpu_seconds']} s exceeded "
                               f"({watch.cpu_seconds:.1f} s used); the sandbox was killed")
    if watch.stopped == "memory_limit_exceeded":
        return watch.stopped, (f"memory limit of {limits['memory_bytes']} bytes exceeded "
                               f"({watch.peak_memory_bytes} bytes resident); the sandbox "
                               "was killed")
    if watch.stopped == "cancelled":
        return "cancelled", "cancelled; every process of the sandbox was killed"
    code = watch.exit_status
    if code is None:
        return "killed", "the task ended without an exit status"
    if code == SETUP_FAILED_EXIT and SETUP_FAILED_TEXT in log_tail:
        return "failed_to_start", _line_with(log_tail, SETUP_FAILED_TEXT)
    if code == 0:
        return "exited", None
    signum = code - 128 if code > 128 else 0
    if signum == signal.SIGXCPU or (signum == signal.SIGKILL
                                    and watch.cpu_seconds >= limits["cpu_seconds"]):
        return "cpu_time_exceeded", (f"CPU time limit of {limits['cpu_seconds']} s exceeded "
                                     "(SIGXCPU)")
    if signum == signal.SIGXFSZ:
        return "killed", f"a file grew beyond the sandbox's limit of {FILE_BYTES} bytes"
    if b"No space left on device" in log_tail:
        return "exited", (f"the task exited with status {code}: its disk quota of "
                          f"{limits.get('disk_bytes', DISK_BYTES)} bytes is full (No space "
                          "left on device); the patch holds what it wrote")
    if any(word in log_tail for word in _MEMORY_WORDS):
        return "memory_limit_exceeded", (
            f"memory limit of {limits['memory_bytes']} bytes per process: an allocation "
            "failed (see the log)")
    if signum and os.WIFSIGNALED(watch.status or 0):
        return "killed", f"the task was killed by {signal.Signals(signum).name}"
    return "exited", f"the task exited with status {code}"


class Hold:
    """How an idle task is held: a freezer cgroup of its own when the monitor can make one
    (the task joins it through the trampoline, and whatever it starts is born inside), else
    SIGSTOP to each of its processes (repeated until no new one appears). Either way its
    memory stays where it is."""

    def __init__(self, cgroup: Path | None) -> None:
        self.cgroup = cgroup
        self.stopped: list[psutil.Process] = []
        self.detail = ""

    @classmethod
    def create(cls, directory: Path, sandbox_id: str, root: Path = FREEZER_ROOT) -> Hold:
        # The directory's hash keeps two agents' sandboxes of the same id apart.
        digest = hashlib.sha256(str(directory).encode()).hexdigest()[:8]
        cgroup = root / "stasis" / f"{sandbox_id}-{digest}"
        try:
            cgroup.mkdir(parents=True, exist_ok=True)
            (cgroup / "freezer.state").read_text()
        except OSError:
            return cls(None)
        return cls(cgroup)

    def freeze(self, procs: Sequence[psutil.Process]) -> str:
        """Hold every process of the task; says how."""
        outside = list(procs)
        if self.cgroup is not None:
            try:
                (self.cgroup / "freezer.state").write_text("FROZEN")
                deadline = time.monotonic() + 10
                while (self.cgroup / "freezer.state").read_text().strip() != "FROZEN" and \
                        time.monotonic() < deadline:
                    time.sleep(0.01)
                members = {int(p) for p in (self.cgroup / "cgroup.procs").read_text().split()}
                outside = [p for p in procs if p.pid not in members]
                self.detail = "cgroup v1 freezer"
            except (OSError, ValueError) as exc:
                self.detail = f"SIGSTOP (the freezer failed: {exc})"
        else:
            self.detail = "SIGSTOP to every process (no freezer cgroup here)"
        for _ in range(5):
            fresh = [p for p in outside if p not in self.stopped]
            if not fresh:
                break
            for proc in fresh:
                with contextlib.suppress(psutil.Error):
                    proc.suspend()
                    self.stopped.append(proc)
            # A process may have forked between the listing and its stop.
            outside = [c for p in fresh for c in _children(p) if c not in self.stopped]
        return self.detail

    def thaw(self) -> None:
        if self.cgroup is not None:
            with contextlib.suppress(OSError):
                (self.cgroup / "freezer.state").write_text("THAWED")
        for proc in self.stopped:
            with contextlib.suppress(psutil.Error):
                proc.resume()
        self.stopped = []

    def frozen(self) -> bool:
        """Whether the task is held now (tests and status)."""
        if self.cgroup is not None:
            with contextlib.suppress(OSError):
                return (self.cgroup / "freezer.state").read_text().strip() == "FROZEN"
        return bool(self.stopped)

    def remove(self) -> None:
        """Thaw and remove the cgroup (empty once the task's processes are gone)."""
        self.thaw()
        if self.cgroup is None:
            return
        for _ in range(50):
            try:
                self.cgroup.rmdir()
                return
            except FileNotFoundError:
                return
            except OSError:
                time.sleep(0.1)


def _children(proc: psutil.Process) -> list[psutil.Process]:
    try:
        return list(proc.children(recursive=True))
    except psutil.Error:
        return []


def _line_with(text: bytes, needle: bytes) -> str:
    for line in text.splitlines():
        if needle in line:
            return line.decode(errors="replace").strip()
    return needle.decode()


class Monitor:
    def __init__(self, directory: Path, spec: Mapping[str, Any]) -> None:
        self.dir = directory
        self.spec = spec
        self.limits: dict[str, int] = dict(spec["limits"])
        self.disk = directory / "disk"
        self.work = self.disk / "work"
        self.home = self.disk / "home"
        self.tmp = self.disk / "tmp"
        self.log_path = directory / "log.txt"
        self.patch_path = directory / "patch.diff"
        self.cancelled = False
        self.resume_asked = False
        self.collected = False
        self._current: tuple[subprocess.Popen[bytes], Watch] | None = None
        self._uid: int | None = spec.get("uid")
        self.idle_seconds = int(self.limits.get("idle_seconds") or 0)
        self.hold: Hold | None = None
        self._base_sha: str | None = None

    # -- the whole run ---------------------------------------------------------------------

    def run(self) -> dict[str, Any]:
        began = time.monotonic()
        # First, while this process has one thread (unshare refuses a threaded one).
        disk_problem = self._make_disk()
        signal.signal(signal.SIGTERM, self._cancel)
        signal.signal(signal.SIGUSR1, self._resume)
        _libc().prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0)
        # Not dumpable: /proc/<monitor>/environ (the agent's credentials) is then closed to
        # a task running as the same user (an agent that is not root).
        _libc().prctl(PR_SET_DUMPABLE, 0, 0, 0, 0)
        result: dict[str, Any] = {
            "sandbox_id": self.spec["sandbox_id"], "succeeded": False, "exit_status": None,
            "patch_uri": None, "log_uri": None, "error": None, "termination": "exited",
            "base_sha": None, "patch_bytes": 0, "files_changed": [], "duration_ms": 0,
            "cpu_seconds": 0.0, "peak_memory_bytes": 0, "network": self.spec["network"],
        }
        with open(self.log_path, "ab") as log:
            self._say(log, f"sandbox {self.spec['sandbox_id']}: {self.spec['command']}")
            try:
                if disk_problem:
                    raise PrepareError(disk_problem)
                base_sha = self.prepare(log)
            except PrepareError as exc:
                self._say(log, f"could not start: {exc}")
                result.update(termination="failed_to_start", error=str(exc))
            else:
                result["base_sha"] = self._base_sha = base_sha
                watch = self.execute(log)
                termination, error = classify(watch, self.limits, _tail(self.log_path))
                result.update(termination=termination, error=error,
                              exit_status=watch.exit_status,
                              cpu_seconds=round(watch.cpu_seconds, 3),
                              peak_memory_bytes=watch.peak_memory_bytes,
                              succeeded=termination == "exited" and watch.exit_status == 0)
                held = (f" (and {watch.suspended_seconds:.1f} s suspended, "
                        f"{watch.suspensions} times)" if watch.suspensions else "")
                self._say(log, f"{termination}: {error or 'exit status 0'} after "
                               f"{watch.seconds:.1f} s{held}")
                try:
                    files = self.collect(base_sha)
                    result.update(patch_bytes=self.patch_path.stat().st_size,
                                  files_changed=files)
                    self._say(log, f"patch: {len(files)} files, "
                                   f"{result['patch_bytes']} bytes")
                except PrepareError as exc:
                    self._say(log, f"no patch: {exc}")
                    result["error"] = (f"{error}; " if error else "") + f"no patch: {exc}"
                    result["succeeded"] = False
        result["duration_ms"] = int((time.monotonic() - began) * 1000)
        self.upload(result)
        if not os.environ.get("STASIS_SANDBOX_KEEP"):
            for path in (self.work, self.home, self.tmp, self.dir / "collect"):
                shutil.rmtree(path, ignore_errors=True)
        return result

    def _cancel(self, _signum: int, _frame: object) -> None:
        self.cancelled = True

    def _resume(self, _signum: int, _frame: object) -> None:
        self.resume_asked = True

    def _make_disk(self) -> str | None:
        """Step 0 (see the module docstring); the reason when the quota cannot be made."""
        self.disk.mkdir(mode=0o711, exist_ok=True)
        if not self.spec.get("disk_quota"):
            return None
        size = int(self.limits.get("disk_bytes") or DISK_BYTES)
        try:
            private_mount_namespace()
            mount("tmpfs", str(self.disk), "tmpfs", MS_NOSUID | MS_NODEV,
                  f"size={size},mode=0711", f"mounting the {size}-byte disk quota (tmpfs)")
        except SetupError as exc:
            return f"the sandbox's disk quota could not be made: {exc}"
        return None

    @staticmethod
    def _say(log: Any, line: str) -> None:
        log.write(f"# {time.strftime('%H:%M:%S')} {line}\n".encode())
        log.flush()

    # -- 1. the working copy ---------------------------------------------------------------

    def prepare(self, log: Any) -> str:
        repository = str(self.spec["repository"])
        if "://" not in repository and not repository.startswith("git@"):
            source = Path(repository)
            if not source.is_absolute() or not source.is_dir():
                raise PrepareError(f"repository {repository} is not a directory on this host "
                                   "(give an absolute path or a git URL)")
        ref = str(self.spec["base_ref"])
        if ref.startswith("-"):
            raise PrepareError(f"base ref {ref!r} is not a ref")
        # A root agent cloning a user's repository: git calls it of "dubious ownership".
        # Only the clone's reading side runs in it, which honours no command-running
        # setting of a repository's own config; nothing else ever runs there. git takes
        # safe.directory from protected config only (not -c, in git 2.39): a global config
        # file of the clone's own says it.
        trust = self.dir / "clone.gitconfig"
        trust.write_text("".join(f"[safe]\n\tdirectory = {d}\n"
                                 for d in (repository, f"{repository.rstrip('/')}/.git")))
        self._git("clone", "--no-hardlinks", "--no-checkout", "--quiet", "--", repository,
                  str(self.work), cwd=self.dir, env={"GIT_CONFIG_GLOBAL": str(trust)})
        sha = None
        for candidate in (ref, f"origin/{ref}"):
            out = self._git("rev-parse", "--verify", "--quiet", f"{candidate}^{{commit}}",
                            cwd=self.work, check=False)
            if out:
                sha = out.strip()
                break
        if sha is None:
            raise PrepareError(f"base ref {ref!r} is not a commit of {repository}")
        self._git("checkout", "--quiet", "--detach", sha, cwd=self.work)
        self._git("remote", "remove", "origin", cwd=self.work, check=False)
        for path in (self.home, self.tmp):
            path.mkdir(mode=0o700, exist_ok=True)
        if self._uid is not None:
            for path in (self.work, self.home, self.tmp):
                _chown_tree(path, self._uid, int(self.spec["gid"]))
        os.chmod(self.work, 0o700)
        disk = ("a tmpfs of its own" if self.spec.get("disk_quota") else
                "NOT LIMITED on this host (only RLIMIT_FSIZE per file)")
        hidden = ", ".join(self.spec.get("hide") or ()) or "NOTHING (no mount namespace)"
        self._say(log, f"base {ref} = {sha}; limits {self.limits}; network: "
                       f"{self.spec['network']}; disk: {disk}; hidden: {hidden}"
                       + (f"; user {self._uid}" if self._uid is not None else ""))
        return sha

    def _git(self, *args: str, cwd: Path, check: bool = True,
             env: Mapping[str, str] | None = None) -> str:
        try:
            done = subprocess.run(["git", *args], cwd=cwd, capture_output=True,
                                  timeout=CLONE_TIMEOUT, stdin=subprocess.DEVNULL,
                                  env={**os.environ, "GIT_TERMINAL_PROMPT": "0", **(env or {})})
        except (OSError, subprocess.TimeoutExpired) as exc:
            raise PrepareError(f"git {_verb(args)}: {exc}") from exc
        if check and done.returncode != 0:
            why = [line for line in done.stderr.decode(errors="replace").splitlines()
                   if line.startswith("fatal:")] or done.stderr.decode(errors="replace").split("\n")
            raise PrepareError(f"git {_verb(args)} failed: {why[0].strip() or done.returncode}")
        return done.stdout.decode(errors="replace") if done.returncode == 0 else ""

    # -- 2. the task -------------------------------------------------------------------------

    def _env(self) -> dict[str, str]:
        return scrubbed_env(sandbox_id=self.spec["sandbox_id"], home=str(self.home),
                            tmp=str(self.tmp), path=str(self.spec["path"]), host=os.environ)

    def execute(self, log: Any) -> Watch:
        if self.idle_seconds:
            # STASIS_SANDBOX_FREEZER: where the freezer hierarchy is; empty: SIGSTOP only.
            freezer = os.environ.get("STASIS_SANDBOX_FREEZER", str(FREEZER_ROOT))
            self.hold = (Hold.create(self.dir, str(self.spec["sandbox_id"]), Path(freezer))
                         if freezer else Hold(None))
        argv = exec_argv(self.spec, ["/bin/sh", "-c", str(self.spec["command"])],
                         cwd=str(self.work), cpu_seconds=self.limits["cpu_seconds"],
                         memory_bytes=self.limits["memory_bytes"], file_bytes=FILE_BYTES,
                         cgroup=self.hold.cgroup if self.hold else None)
        try:
            return self._watched(argv, stdout=log, wall=self.limits["wall_clock_seconds"],
                                 idle=self.idle_seconds)
        finally:
            if self.hold is not None:
                self.hold.remove()

    def _watched(self, argv: list[str], *, stdout: Any, wall: float, idle: int = 0) -> Watch:
        """Run argv, watching the whole tree until the direct child and every other
        process of the sandbox are gone; with ``idle``, suspend it when it makes no
        progress for that many seconds (suspended time is not run time)."""
        watch = Watch()
        baseline = _children_cpu()
        began = time.monotonic()
        progress_at, mark = began, None
        try:
            popen = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=stdout,
                                     stderr=subprocess.STDOUT if stdout is not None else None,
                                     env=self._env(), close_fds=True, start_new_session=True)
        except OSError as exc:
            watch.notes.append(f"cannot start: {exc}")
            return watch
        self._current = (popen, watch)
        while True:
            self._reap()
            if watch.status is not None:
                break
            elapsed = time.monotonic() - began - watch.suspended_seconds
            procs = self._processes()
            rss, cpu = _usage(procs)
            watch.cpu_seconds = max(watch.cpu_seconds, cpu + _children_cpu() - baseline)
            watch.peak_memory_bytes = max(watch.peak_memory_bytes, rss)
            reason = None
            if self.cancelled:
                reason = "cancelled"
            elif elapsed > wall:
                reason = "wall_clock_exceeded"
            elif watch.cpu_seconds > self.limits["cpu_seconds"]:
                reason = "cpu_time_exceeded"
            elif rss > self.limits["memory_bytes"]:
                reason = "memory_limit_exceeded"
            if reason is not None:
                watch.stopped = watch.stopped or reason
                self._kill_all()
                if elapsed > wall + 30:
                    break  # nothing may keep a monitor (and its uid) busy for ever
                continue
            if idle and procs:
                now = time.monotonic()
                seen = (round(watch.cpu_seconds, 2), _io_chars(procs),
                        frozenset(p.pid for p in procs))
                if seen != mark:
                    progress_at, mark = now, seen
                elif now - progress_at >= idle:
                    held, cost = self._suspend(watch, procs, stdout, idle_for=now - progress_at,
                                               elapsed=elapsed)
                    watch.suspended_seconds += held
                    baseline += cost  # the checkpoint's git is not the task's CPU time
                    progress_at, mark = time.monotonic(), None
                    continue
            time.sleep(SAMPLE_SECONDS)
        # The task's own leftovers (a daemon it started) end with it.
        self._kill_all()
        self._reap()
        self._current = None
        watch.cpu_seconds = max(watch.cpu_seconds, _children_cpu() - baseline)
        watch.seconds = time.monotonic() - began - watch.suspended_seconds
        return watch

    # -- idle: suspend, checkpoint, wait for a resume --------------------------------------

    def _suspend(self, watch: Watch, procs: list[psutil.Process], log: Any, *,
                 idle_for: float, elapsed: float) -> tuple[float, float]:
        """Hold the task, upload a checkpoint, wait for a resume or a cancel, let it go on.
        Returns (seconds held, CPU seconds the checkpoint's git used)."""
        assert self.hold is not None
        self.resume_asked = False
        held_from = time.monotonic()
        sequence = watch.suspensions + 1
        how = self.hold.freeze(procs)
        cost_from = _children_cpu()
        checkpoint = self._checkpoint(sequence)
        cost = _children_cpu() - cost_from
        self._say(log, f"no progress for {idle_for:.0f} s: suspended ({how}; CPU released, "
                       f"memory stays resident); {checkpoint['detail']}")
        payload = {
            "sandbox_id": self.spec["sandbox_id"], "idle_seconds": int(idle_for),
            "sequence": sequence, "method": "freeze",
            "checkpoint_uri": checkpoint["uri"], "checkpoint_bytes": checkpoint["bytes"],
            "files_changed": checkpoint["files"], "elapsed_ms": int(elapsed * 1000),
            "cpu_seconds": round(watch.cpu_seconds, 3), "memory_released": False,
            "detail": f"process tree held by {how}; CPU and slot released, memory stays "
                      f"resident; {checkpoint['detail']}",
        }
        state = {"sequence": sequence, "state": "suspended", "method": how,
                 "since": time.time(), "payload": payload}
        write_json(self.dir / "suspended.json", state)
        watch.suspensions = sequence
        while not self.cancelled and not self.resume_asked and watch.status is None:
            if not (self.dir / "spec.json").exists():
                # The agent removed the sandbox: nobody can resume it any more.
                self.cancelled = True
                break
            self._reap()
            time.sleep(SAMPLE_SECONDS)
        self.hold.thaw()
        held = time.monotonic() - held_from
        state.update(state="cancelled" if self.cancelled else "resumed", held_seconds=held)
        write_json(self.dir / "suspended.json", state)
        self._say(log, f"{state['state']} after {held:.1f} s suspended")
        return held, cost

    def _checkpoint(self, sequence: int) -> dict[str, Any]:
        """The working copy's diff against the base now, uploaded; never fatal. A private
        index (a copy of the task's) is used, so the task's own index is not changed."""
        out: dict[str, Any] = {"uri": None, "bytes": 0, "files": [], "detail": ""}
        began = time.monotonic()
        base_sha = self._base_sha
        if base_sha is None or not (self.work / ".git").is_dir():
            out["detail"] = "no checkpoint: no repository in the working copy"
            return out
        private = self.dir / "checkpoint"
        patch = self.dir / f"checkpoint-{sequence}.diff"
        names = private / "files.txt"
        git_env, steps = self._diff_steps(private, base_sha, patch, names)
        env = {**self._env(), **git_env}
        memory = max(self.limits["memory_bytes"], 512 << 20)
        try:
            for argv, target in steps:
                full = exec_argv(self.spec, argv, cwd=str(self.work), cpu_seconds=120,
                                 memory_bytes=memory, file_bytes=PATCH_BYTES,
                                 net="isolated" if self.spec.get("isolation") else "host")
                with open(target or os.devnull, "wb") as sink:
                    done = subprocess.run(full, stdin=subprocess.DEVNULL, stdout=sink,
                                          stderr=subprocess.PIPE, env=env, close_fds=True,
                                          start_new_session=True, timeout=CHECKPOINT_TIMEOUT,
                                          check=False)
                if done.returncode != 0:
                    why = done.stderr.decode(errors="replace").strip().splitlines()
                    raise PrepareError(f"{' '.join(argv[:2])}: "
                                       f"{why[-1] if why else done.returncode}")
            out["files"] = [n for n in names.read_bytes().decode(errors="replace").split("\0")
                            if n]
            out["bytes"] = patch.stat().st_size
            prefix = str(self.spec["prefix"]).strip("/")
            bucket_name = str(self.spec["bucket"])
            name = f"{prefix}/checkpoint-{sequence}.diff"
            _upload(_storage_client().bucket(bucket_name), name, patch, "text/x-diff")
            out["uri"] = f"gs://{bucket_name}/{name}"
            out["detail"] = (f"checkpoint {sequence}: {len(out['files'])} files, "
                             f"{out['bytes']} bytes, taken and uploaded in "
                             f"{time.monotonic() - began:.2f} s")
        except Exception as exc:  # a checkpoint is for people to look at: never fatal
            out.update(uri=None, detail=f"no checkpoint: {type(exc).__name__}: {exc}")
        finally:
            shutil.rmtree(private, ignore_errors=True)
        return out

    def _reap(self) -> None:
        """Reap every exited child (the monitor is a subreaper: orphans come here too),
        keeping the direct child's status: the only place that waits."""
        while True:
            try:
                pid, status = os.waitpid(-1, os.WNOHANG)
            except ChildProcessError:
                pid, status = -1, 0
            current = self._current
            if current is not None and current[1].status is None and (
                    pid == current[0].pid or (pid == -1 and current[0].returncode is None)):
                if pid == -1:
                    # No child left at all, yet no status: never spin on a lost one.
                    status = 9
                current[1].status = status
                current[0].returncode = current[1].exit_status  # Popen must not wait again
            if pid <= 0:
                return

    def _processes(self) -> list[psutil.Process]:
        """Every live process of the sandbox: the monitor's descendants, and every process
        of the sandbox's user when it has one."""
        found: dict[int, psutil.Process] = {}
        with contextlib.suppress(psutil.Error):
            for child in psutil.Process().children(recursive=True):
                found[child.pid] = child
        if self._uid is not None:
            for proc in psutil.process_iter(["uids"]):
                with contextlib.suppress(psutil.Error, TypeError):
                    if proc.info["uids"].real == self._uid:
                        found[proc.pid] = proc
        return [p for p in found.values() if is_live(p)]

    def _kill_all(self) -> None:
        for _ in range(50):
            procs = self._processes()
            if not procs:
                return
            for proc in procs:
                with contextlib.suppress(psutil.Error):
                    proc.kill()
            psutil.wait_procs(procs, timeout=1)
            self._reap()

    # -- 3. the patch ------------------------------------------------------------------------

    def _diff_steps(self, private: Path, base_sha: str, patch: Path, names: Path,
                    ) -> tuple[dict[str, str], list[tuple[list[str], Path | None]]]:
        """The environment and git steps that diff the working copy (its commits and every
        file in it) against the base, each run as the sandbox. The index and the objects
        ``git add`` writes are ``private``'s, outside the disk quota: a full disk still
        gives its patch, and the task's own index is left as it was."""
        shutil.rmtree(private, ignore_errors=True)
        (private / "objects").mkdir(parents=True, mode=0o700)
        os.chmod(private, 0o700)
        if self._uid is not None:
            _chown_tree(private, self._uid, int(self.spec["gid"]))
        env = {"GIT_INDEX_FILE": str(private / "index"),
               "GIT_OBJECT_DIRECTORY": str(private / "objects"),
               "GIT_ALTERNATE_OBJECT_DIRECTORIES": str(self.work / ".git" / "objects")}
        return env, [
            (["git", "read-tree", "HEAD"], None),
            (["git", "add", "-A"], None),
            (["git", "diff", "--cached", "--binary", base_sha], patch),
            (["git", "diff", "--cached", "--name-only", "-z", base_sha], names),
        ]

    def collect(self, base_sha: str) -> list[str]:
        """The binary diff of the working copy against the base (``_diff_steps``)."""
        if not (self.work / ".git").exists():
            raise PrepareError("the task removed the repository (.git)")
        memory = max(self.limits["memory_bytes"], 512 << 20)
        names_path = self.dir / "files.txt"
        git_env, steps = self._diff_steps(self.dir / "collect", base_sha, self.patch_path,
                                          names_path)
        for argv, out_path in steps:
            with open(out_path or os.devnull, "wb") as out, \
                    open(self.dir / "collect.log", "ab") as errors:
                # The network is never needed for a diff: isolated wherever the host can.
                full = exec_argv(self.spec, argv, cwd=str(self.work), cpu_seconds=120,
                                 memory_bytes=memory, file_bytes=PATCH_BYTES,
                                 net="isolated" if self.spec.get("isolation") else "host")
                watch = self._watched_to(full, out, errors, git_env)
            if watch.stopped or watch.exit_status != 0:
                tail = _tail(self.dir / "collect.log").decode(errors="replace").strip()
                why = watch.stopped or f"exit status {watch.exit_status}"
                raise PrepareError(f"{' '.join(argv[:2])} failed ({why}): "
                                   f"{tail.splitlines()[-1] if tail else ''}")
        self.collected = True
        shutil.rmtree(self.dir / "collect", ignore_errors=True)
        return [n for n in names_path.read_bytes().decode(errors="replace").split("\0") if n]

    def _watched_to(self, argv: list[str], out: Any, errors: Any,
                    env: Mapping[str, str]) -> Watch:
        watch = Watch()
        began = time.monotonic()
        try:
            popen = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=out, stderr=errors,
                                     env={**self._env(), **env}, close_fds=True,
                                     start_new_session=True)
        except OSError as exc:
            raise PrepareError(f"cannot run {argv[0]}: {exc}") from exc
        self._current = (popen, watch)
        while watch.status is None:
            self._reap()
            if watch.status is None and time.monotonic() - began > COLLECT_TIMEOUT:
                watch.stopped = "timed out"
                self._kill_all()
            time.sleep(0.02)
        self._kill_all()
        self._current = None
        return watch

    # -- 4. upload ---------------------------------------------------------------------------

    def upload(self, result: dict[str, Any]) -> None:
        bucket_name = str(self.spec["bucket"])
        prefix = str(self.spec["prefix"]).strip("/")
        try:
            bucket = _storage_client().bucket(bucket_name)
            if self.collected:
                _upload(bucket, f"{prefix}/patch.diff", self.patch_path, "text/x-diff")
                result["patch_uri"] = f"gs://{bucket_name}/{prefix}/patch.diff"
            _upload(bucket, f"{prefix}/log.txt", self.log_path, "text/plain")
            result["log_uri"] = f"gs://{bucket_name}/{prefix}/log.txt"
            blob = bucket.blob(f"{prefix}/result.json")
            blob.upload_from_string(json.dumps(result, indent=2),
                                    content_type="application/json")
        except Exception as exc:  # the result still reaches the agent, with the reason
            result["succeeded"] = False
            result["error"] = ((result["error"] + "; ") if result["error"] else "") + (
                f"could not upload to gs://{bucket_name}/{prefix}/: {type(exc).__name__}: "
                f"{exc}; the patch and log stay in {self.dir}")


def _upload(bucket: Any, name: str, path: Path, content_type: str) -> None:
    for attempt in range(3):
        try:
            bucket.blob(name).upload_from_filename(str(path), content_type=content_type)
            return
        except Exception:
            if attempt == 2:
                raise
            time.sleep(0.5 * 2**attempt)


def _storage_client() -> Any:
    from google.cloud import storage

    if os.environ.get("STORAGE_EMULATOR_HOST"):
        return storage.Client.create_anonymous_client()
    return storage.Client(project=os.environ.get("STASIS_PROJECT") or None)


def _verb(args: Sequence[str]) -> str:
    """The git subcommand of an argument list that may start with ``-c key=value``."""
    rest = list(args)
    while rest[:1] == ["-c"]:
        rest = rest[2:]
    return rest[0] if rest else "?"


def _libc() -> ctypes.CDLL:
    return ctypes.CDLL(None, use_errno=True)


def _children_cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def _usage(procs: Sequence[psutil.Process]) -> tuple[int, float]:
    """(resident bytes, CPU seconds incl. reaped descendants) summed over ``procs``."""
    rss, cpu = 0, 0.0
    for proc in procs:
        with contextlib.suppress(psutil.Error), proc.oneshot():
            rss += proc.memory_info().rss
            times = proc.cpu_times()
            cpu += times.user + times.system + times.children_user + times.children_system
    return rss, cpu


def _io_chars(procs: Sequence[psutil.Process]) -> int:
    """Bytes read and written by ``procs`` (any file, pipe or socket), summed."""
    total = 0
    for proc in procs:
        with contextlib.suppress(psutil.Error, AttributeError):
            io = proc.io_counters()
            total += io.read_chars + io.write_chars
    return total


def _chown_tree(root: Path, uid: int, gid: int) -> None:
    os.lchown(root, uid, gid)
    for dirpath, dirnames, filenames in os.walk(root):
        for name in (*dirnames, *filenames):
            os.lchown(os.path.join(dirpath, name), uid, gid)


def _tail(path: Path, size: int = 64 << 10) -> bytes:
    try:
        with open(path, "rb") as f:
            f.seek(max(0, f.seek(0, os.SEEK_END) - size))
            return f.read()
    except OSError:
        return b""


def reachable_by_others(path: str) -> bool:
    """Whether a user other than the owner can traverse to ``path`` and into it."""
    current = Path(path)
    if not current.is_absolute():
        return False
    for part in [current, *current.parents]:
        try:
            mode = part.stat().st_mode
        except OSError:
            return False
        if not mode & stat.S_IXOTH:
            return False
    return True


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if len(args) != 1:
        print("usage: python -m runtime.local.sandbox_task DIR", file=sys.stderr)
        return 2
    directory = Path(args[0]).resolve()
    spec = json.loads((directory / "spec.json").read_text())
    write_json(directory / "result.json", Monitor(directory, spec).run())
    return 0


if __name__ == "__main__":
    sys.exit(main())
