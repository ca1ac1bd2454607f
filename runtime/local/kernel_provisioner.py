"""The kernel provisioner of a workspace's jupyter-server: its first kernel is the warm
kernel the agent handed to this workspace, when there is one.

jupyter_client's documented extension point (``KernelProvisionerBase``, entry point group
``jupyter_client.kernel_provisioners``, chosen by a kernel spec's
``metadata.kernel_provisioner``): the home venv's kernel spec (``runtime.local.userenv``)
names ``stasis-warm``. This is jupyter_client's ``LocalProvisioner`` in all but
``launch_kernel``, which first tries to claim the kernel ``runtime.local.prekernel``
offered in this server's runtime dir:

- only a command of the form ``PYTHON -m ipykernel_launcher -f CONNECTION_FILE`` (the
  venv's own spec) is claimed; the offering process must be alive and run as this
  server's user; and a home venv that installed its own copy of a package the warm kernel
  has already imported (numpy, ipykernel, ...) is not claimed (that kernel would run the
  environment's copy where a cold one runs the home's);
- the claim renames the offer away first (one rename succeeds: a warm kernel is claimed
  at most once), then writes the command, environment and cwd jupyter-server would have
  launched a cold kernel with into the kernel's FIFO;
- anything else (no offer: a second kernel, a restart, a pool of 0; a refused or failed
  claim) is ``LocalProvisioner.launch_kernel``, exactly today's cold start. A claimed
  kernel whose claim failed is killed, never offered again.

The claimed kernel is not this server's child: ``_Claimed`` stands in for the ``Popen``
the base class keeps (``poll`` reads ``/proc``, signals go to the kernel's process group,
as the base class sends them), so interrupt, restart and shutdown work unchanged. The node
agent reaps it (it is the agent's child) and records it with the server, so a stop ends it.

Keep the imports light: this module is imported by every workspace's jupyter-server.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import time
from pathlib import Path
from typing import Any

from jupyter_client.connect import KernelConnectionInfo
from jupyter_client.provisioning.local_provisioner import LocalProvisioner

OFFER = "stasis-warm-kernel.json"  # runtime.local.prekernel's (not imported: its imports)
NAME = "stasis-warm"
_LAUNCHERS = ("ipykernel_launcher", "ipykernel")


class _Claimed:
    """The claimed kernel, as much of a ``Popen`` as ``LocalProvisioner`` uses."""

    stdin = stdout = stderr = None

    def __init__(self, pid: int) -> None:
        self.pid = pid
        self.returncode: int | None = None

    def poll(self) -> int | None:
        if self.returncode is None and not _alive(self.pid):
            self.returncode = 0  # not our child: its exit status is the agent's to reap
        return self.returncode

    def wait(self, timeout: float | None = None) -> int:
        deadline = None if timeout is None else time.monotonic() + timeout
        while self.poll() is None:
            if deadline is not None and time.monotonic() > deadline:
                raise TimeoutError(f"kernel {self.pid} still runs")
            time.sleep(0.05)
        assert self.returncode is not None
        return self.returncode

    def send_signal(self, signum: int) -> None:
        if self.poll() is None:
            os.kill(self.pid, signum)

    def kill(self) -> None:
        self.send_signal(signal.SIGKILL)

    def terminate(self) -> None:
        self.send_signal(signal.SIGTERM)


def _alive(pid: int) -> bool:
    """Whether ``pid`` runs (a zombie does not: it waits for the agent to reap it)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat.rpartition(")")[2].split()[0] not in ("Z", "X")


def _uids(pid: int) -> list[int]:
    """The real, effective, saved and filesystem uids of ``pid`` (``/proc/<pid>/status``:
    readable whatever the process's dumpable flag, unlike the owner of ``/proc/<pid>``,
    which is root's after a process dropped from root)."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("Uid:"):
            return [int(n) for n in line.split()[1:]]
    raise ValueError(f"no Uid line for {pid}")


def claimable(cmd: list[str], runtime_dir: Path) -> dict[str, Any] | None:
    """The offer in ``runtime_dir`` when this kernel command may take it, else None."""
    if len(cmd) != 5 or cmd[1] != "-m" or cmd[2] not in _LAUNCHERS or cmd[3] != "-f":
        return None
    try:
        offer: dict[str, Any] = json.loads((runtime_dir / OFFER).read_text())
        owners = _uids(int(offer["pid"]))
    except (OSError, ValueError, KeyError, TypeError):
        return None
    if set(owners) != {os.getuid()} or not _alive(int(offer["pid"])):
        return None
    venv = Path(cmd[0]).parent.parent
    imported = set(offer.get("imported") or [])
    for site in venv.glob("lib/python*/site-packages"):
        with contextlib.suppress(OSError):
            mine = {entry.name.removesuffix(".py") for entry in os.scandir(site)}
            if mine & imported:  # the home installed its own copy of one of them
                return None
    return offer


class WarmKernelProvisioner(LocalProvisioner):
    """``LocalProvisioner`` whose first launch claims the workspace's warm kernel."""

    async def launch_kernel(self, cmd: list[str], **kwargs: Any) -> KernelConnectionInfo:
        connection_file = getattr(self.parent, "connection_file", "") or ""
        runtime_dir = Path(connection_file).parent if connection_file else None
        offer = claimable(cmd, runtime_dir) if runtime_dir is not None else None
        if offer is not None and cmd[4] == connection_file:
            pid = self._claim(offer, cmd, runtime_dir, kwargs)  # type: ignore[arg-type]
            if pid is not None:
                self.process = _Claimed(pid)  # type: ignore[assignment]  # a Popen in all it uses
                self.pid = pid
                with contextlib.suppress(OSError):
                    self.pgid = os.getpgid(pid)
                self.cwd = kwargs.get("cwd") or os.getcwd()
                self.log.info("kernel %s: claimed the warm kernel %d", self.kernel_id, pid)
                return self.connection_info
        connection_info: KernelConnectionInfo = await super().launch_kernel(cmd, **kwargs)
        return connection_info

    def _claim(self, offer: dict[str, Any], cmd: list[str], runtime_dir: Path,
               kwargs: dict[str, Any]) -> int | None:
        """Take the offer (at most once) and hand the kernel its launch; its pid, or None
        (the caller starts cold)."""
        pid = int(offer["pid"])
        taken = runtime_dir / f".{OFFER}.claimed-{self.kernel_id}"
        try:
            os.rename(runtime_dir / OFFER, taken)
        except OSError:
            return None  # claimed meanwhile
        taken.unlink(missing_ok=True)
        env = dict(kwargs.get("env") or os.environ)
        launch = {"argv": cmd, "env": env, "cwd": str(kwargs.get("cwd") or os.getcwd()),
                  "server_pid": os.getpid()}
        try:
            fd = os.open(str(offer["fifo"]), os.O_WRONLY | os.O_NONBLOCK)
            try:
                os.set_blocking(fd, True)
                os.write(fd, json.dumps(launch).encode() + b"\n")
            finally:
                os.close(fd)
        except OSError as exc:
            self.log.warning("the warm kernel %d could not take the launch (%s); starting "
                             "cold", pid, exc)
            with contextlib.suppress(OSError):
                os.kill(pid, signal.SIGKILL)  # claimed: it serves nobody else
            return None
        return pid
