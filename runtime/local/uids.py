"""Host-wide uid leases: a uid one node agent gives a workspace user or a sandbox user is no
other agent's on the same host.

Each agent picks uids from its own records (``tenancy``: 300000 + n for workspaces,
``sandboxes``: 200000 + n), so two agents on one host (two data dirs, a test beside a stack)
could hand out the same uid, and each one's clean-up kills every process of its uid, the
other's included; two workspaces with one uid could also read each other's homes. So every
uid an agent gives out is first *claimed* here, for as long as it is in use:

- a lease is a file ``<root>/<uid>`` (JSON: ``owner``, the agent's directory that uses it,
  and ``key``, ``workspace:<id>`` or ``sandbox:<id>``), written and read only under an
  exclusive ``flock`` of ``<root>/.lock``, so two claims never interleave;
- :meth:`HostUids.claim` takes the first candidate that no live lease holds and no process
  on the host runs as (psutil), or re-takes the one this owner and key already hold;
- a lease lives until its owner releases it (a workspace destroyed without its home kept,
  a sandbox that ended), or until its owner's directory is gone (a deleted data dir, a test's
  temporary one): then it is stale, and the next claim may take it.

``root`` defaults to ``/var/lib/stasis/uids`` (``STASIS_UID_DIR``): persistent, like the homes
that keep their owner's uid across a reboot (``/run`` would forget every lease at boot while
the homes remember). Only an agent running as root gives uids, so only root writes there.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path
from typing import Any

DEFAULT_ROOT = Path("/var/lib/stasis/uids")
ROOT_VAR = "STASIS_UID_DIR"


class UidTaken(RuntimeError):
    """A uid this owner needs is leased to another on this host."""


def default_root(environ: dict[str, str] | None = None) -> Path:
    env = os.environ if environ is None else environ
    return Path(env.get(ROOT_VAR) or DEFAULT_ROOT)


def live_uids() -> set[int]:
    """The real uids of every process on the host."""
    import psutil

    found: set[int] = set()
    for proc in psutil.process_iter(["uids"]):
        with contextlib.suppress(psutil.Error, TypeError, AttributeError):
            found.add(proc.info["uids"].real)
    return found


class HostUids:
    """The leases of one ``owner`` (an agent's directory: its data dir, its sandboxes' root)."""

    def __init__(self, owner: Path, root: Path | None = None, *,
                 in_use: Callable[[], set[int]] = live_uids) -> None:
        self.owner = str(Path(owner).resolve())
        self.root = Path(root) if root is not None else default_root()
        self._in_use = in_use

    @contextlib.contextmanager
    def _locked(self) -> Iterator[None]:
        self.root.mkdir(parents=True, exist_ok=True, mode=0o755)
        fd = os.open(self.root / ".lock", os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)
            yield
        finally:
            os.close(fd)  # releases the flock

    def _read(self, uid: int) -> dict[str, Any] | None:
        try:
            lease = json.loads((self.root / str(uid)).read_text())
        except FileNotFoundError:
            return None
        except (OSError, ValueError):
            return {"owner": "?", "key": "?"}  # unreadable: held, by whom we cannot say
        return lease if isinstance(lease, dict) else {"owner": "?", "key": "?"}

    def _live(self, lease: dict[str, Any]) -> bool:
        """A lease holds while its owner's directory exists."""
        owner = lease.get("owner")
        return not isinstance(owner, str) or not owner.startswith("/") or Path(owner).exists()

    def _write(self, uid: int, key: str) -> None:
        path = self.root / str(uid)
        temporary = path.with_name(f".{uid}.{os.getpid()}")
        temporary.write_text(json.dumps({"owner": self.owner, "key": key}))
        os.replace(temporary, path)

    def holder(self, uid: int) -> dict[str, Any] | None:
        """The live lease of ``uid``, or None."""
        with self._locked():
            lease = self._read(uid)
            return lease if lease is not None and self._live(lease) else None

    def claim(self, key: str, candidates: Iterable[int]) -> int:
        """The first of ``candidates`` this owner may have for ``key``, now leased to it:
        one it already holds for ``key``, or one no live lease holds and no process runs
        as. Raises :class:`UidTaken` when none is left."""
        with self._locked():
            busy: set[int] | None = None
            for uid in candidates:
                lease = self._read(uid)
                if lease is not None and lease.get("owner") == self.owner and \
                        lease.get("key") == key:
                    return uid
                if lease is not None and self._live(lease):
                    continue
                if busy is None:
                    busy = self._in_use()
                if uid in busy:
                    continue
                self._write(uid, key)
                return uid
        raise UidTaken(f"{key}: every candidate uid is leased or in use on this host")

    def hold(self, uid: int, key: str) -> None:
        """Keep the lease of a uid this owner recorded for ``key`` (a resume, an agent
        restart); :class:`UidTaken` if another owner or key holds it now."""
        with self._locked():
            lease = self._read(uid)
            if lease is not None and self._live(lease) and (
                    lease.get("owner") != self.owner or lease.get("key") != key):
                raise UidTaken(f"uid {uid} of {key} is leased to {lease.get('key')} of "
                               f"{lease.get('owner')} on this host")
            if lease is None or lease.get("owner") != self.owner or lease.get("key") != key:
                self._write(uid, key)

    def release(self, uid: int, key: str) -> None:
        """Give up ``uid`` if this owner holds it for ``key``."""
        with self._locked():
            lease = self._read(uid)
            if lease is not None and lease.get("owner") == self.owner and \
                    lease.get("key") == key:
                with contextlib.suppress(FileNotFoundError):
                    (self.root / str(uid)).unlink()

    def held(self) -> dict[int, str]:
        """``{uid: key}`` of this owner's leases."""
        with self._locked():
            found: dict[int, str] = {}
            with contextlib.suppress(FileNotFoundError):
                for entry in os.scandir(self.root):
                    if entry.name.isdigit():
                        lease = self._read(int(entry.name))
                        if lease is not None and lease.get("owner") == self.owner:
                            found[int(entry.name)] = str(lease.get("key"))
            return found
