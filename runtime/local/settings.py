"""Settings of the node agent: where it keeps its files and how long it waits.

Layout under ``data_dir`` (shared with the rest of the local stack, see
``stack.settings``):

    homes/<workspace_id>/        the workspace's home: notebooks, ~/.local, the pip cache
    run/<workspace_id>/          JUPYTER_RUNTIME_DIR of its server (kernel-<id>.json files)
    logs/workspaces/<id>.log     its server's log, appended across starts
    agent/state.json             what the agent supervises (see ``state``)
    agent/agent.lock             held while an agent serves this data dir
    agent/token                  the control plane's credential for the agent (mode 0600)
    agent/workspace_key          the key of the workspaces' identities (mode 0600)

The token is what makes a caller the control plane: the agent answers nothing but
``/healthz`` without it (``Authorization: Bearer <token>``). ``STASIS_NODE_AGENT_TOKEN``
gives it to the function host and the IDE proxy; the CLI reads the file; a workspace's
server and kernels never get it (``servers.server_env`` drops it).
"""

from __future__ import annotations

import contextlib
import os
import secrets
import socket
import tempfile
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

HOST = "127.0.0.1"
DEFAULT_PORT = 8714
DEFAULT_PROJECT = "stasis-local"
TOKEN_VAR = "STASIS_NODE_AGENT_TOKEN"
EVENT_SOURCE = "//stasis/runtime/local"
REPO_ROOT = Path(__file__).resolve().parents[2]


@dataclass(frozen=True)
class AgentSettings:
    """Everything the node agent needs to know before it starts.

    ``start_timeout`` bounds a server's start (until ``/api/status`` answers);
    ``stop_grace`` is how long a server gets after SIGTERM before its processes are
    killed; ``release_grace`` replaces it when a JupyterLab workspace is released or
    destroyed (a pause's last step, before PAUSED is committed): jupyter-server's own
    orderly exit takes about 2 s here and keeps nothing of the user's (its kernels, which
    get the SIGTERM too, die of it at once, having no handler; notebooks are written when
    they are saved, atomically: a save cut short leaves the file as it was), so it is not
    waited for: 0 kills it right after the SIGTERM (0.3 s before took 0.23 s of a 1.77 s
    pause, bench/resume.py); ``kernel_timeout`` bounds the snapshot or restore of one
    kernel.
    """

    data_dir: Path
    project: str = DEFAULT_PROJECT
    port: int = DEFAULT_PORT
    repo_root: Path = REPO_ROOT
    start_timeout: float = 90.0
    stop_grace: float = 10.0
    release_grace: float = 0.0
    kernel_timeout: float = 300.0
    event_source: str = EVENT_SOURCE
    #: The node the workspaces run on, named as a cluster's node is after its VM (the name
    #: a preemption log entry gives: functions/domain/monitoring.py) and as the admin
    #: file's ``scheduling.nodes`` declares it: the host's name unless STASIS_NODE_NAME.
    node_name: str = field(default_factory=socket.gethostname)
    #: The control plane's credential; None: the data dir's ``agent/token`` (made if absent).
    token: str | None = None
    #: Where a resume downloads a snapshot while its server and kernels start (memory:
    #: ``runtime.snapshot.staging``); None, or a path that is not a directory: each kernel
    #: downloads its own, after it started (``STASIS_RESTORE_STAGING=""``).
    restore_staging: Path | None = Path("/dev/shm")

    def __post_init__(self) -> None:
        object.__setattr__(self, "data_dir", Path(self.data_dir).expanduser().resolve())
        if not self.project:
            raise ValueError("project id must not be empty (STASIS_PROJECT)")

    @classmethod
    def from_env(
        cls, environ: Mapping[str, str] = os.environ, **overrides: object
    ) -> AgentSettings:
        """Settings from ``STASIS_DATA_DIR``, ``STASIS_PROJECT``, ``STASIS_NODE_AGENT_PORT``,
        ``STASIS_NODE_NAME`` and ``STASIS_RESTORE_STAGING``; keyword overrides win (the
        command line's flags)."""
        values: dict[str, object] = {
            "data_dir": Path(environ.get("STASIS_DATA_DIR") or ".stasis"),
            "project": environ.get("STASIS_PROJECT") or DEFAULT_PROJECT,
            "port": int(environ.get("STASIS_NODE_AGENT_PORT") or DEFAULT_PORT),
            "node_name": environ.get("STASIS_NODE_NAME") or socket.gethostname(),
            "token": environ.get(TOKEN_VAR) or None,
        }
        if "STASIS_RESTORE_STAGING" in environ:
            staging = environ["STASIS_RESTORE_STAGING"]
            values["restore_staging"] = Path(staging) if staging else None
        values.update({k: v for k, v in overrides.items() if v is not None})
        return cls(**values)  # type: ignore[arg-type]

    @property
    def url(self) -> str:
        return f"http://{HOST}:{self.port}"

    @property
    def homes_dir(self) -> Path:
        return self.data_dir / "homes"

    @property
    def agent_dir(self) -> Path:
        return self.data_dir / "agent"

    @property
    def state_path(self) -> Path:
        return self.agent_dir / "state.json"

    @property
    def lock_path(self) -> Path:
        return self.agent_dir / "agent.lock"

    def control_token(self) -> str:
        """The credential every call but ``/healthz`` must carry."""
        return self.token or control_token(self.data_dir)

    def home(self, workspace_id: str) -> Path:
        return self.homes_dir / workspace_id

    def runtime_dir(self, workspace_id: str) -> Path:
        return self.data_dir / "run" / workspace_id

    def log_path(self, workspace_id: str) -> Path:
        return self.data_dir / "logs" / "workspaces" / f"{workspace_id}.log"


def control_token(data_dir: Path) -> str:
    """The node agent's token of ``data_dir`` (``agent/token``), made on first use: 256
    random bits, readable by the agent's user only (the agent's directory is 0700 too): a
    kernel that runs as another OS user cannot open it."""
    return _secret(data_dir, "token")


def workspace_key(data_dir: Path) -> str:
    """The key of the workspaces' identities (``events.identity``) of ``data_dir``
    (``agent/workspace_key``), made like the token: the node agent mints each workspace's
    token with it, the functions check them; no workspace holds it."""
    return _secret(data_dir, "workspace_key")


def _secret(data_dir: Path, name: str) -> str:
    agent_dir = Path(data_dir).expanduser().resolve() / "agent"
    agent_dir.mkdir(parents=True, exist_ok=True, mode=0o700)
    os.chmod(agent_dir, 0o700)
    path = agent_dir / name
    if not path.exists():
        # Written aside, then linked into place: two first users agree on one token.
        fd, tmp = tempfile.mkstemp(dir=agent_dir, prefix=f".{name}-")
        with os.fdopen(fd, "w") as out:  # mkstemp's file is 0600
            out.write(secrets.token_urlsafe(32))
        with contextlib.suppress(FileExistsError):
            os.link(tmp, path)
        os.unlink(tmp)
    return path.read_text().strip()
