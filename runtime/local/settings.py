"""Settings of the node agent: where it keeps its files and how long it waits.

Layout under ``data_dir`` (shared with the rest of the local stack, see
``stack.settings``):

    homes/<workspace_id>/        the workspace's home: notebooks, ~/.local, the pip cache
    run/<workspace_id>/          JUPYTER_RUNTIME_DIR of its server (kernel-<id>.json files)
    logs/workspaces/<id>.log     its server's log, appended across starts
    agent/state.json             what the agent supervises (see ``state``)
    agent/agent.lock             held while an agent serves this data dir
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

HOST = "127.0.0.1"
DEFAULT_PORT = 8714
DEFAULT_PROJECT = "stasis-local"
EVENT_SOURCE = "//stasis/runtime/local"
REPO_ROOT = Path(__file__).resolve().parents[2]


@dataclass(frozen=True)
class AgentSettings:
    """Everything the node agent needs to know before it starts.

    ``start_timeout`` bounds a server's start (until ``/api/status`` answers);
    ``stop_grace`` is how long a server gets after SIGTERM before its processes are
    killed; ``kernel_timeout`` bounds the snapshot or restore of one kernel.
    """

    data_dir: Path
    project: str = DEFAULT_PROJECT
    port: int = DEFAULT_PORT
    repo_root: Path = REPO_ROOT
    start_timeout: float = 90.0
    stop_grace: float = 10.0
    kernel_timeout: float = 300.0
    event_source: str = EVENT_SOURCE

    def __post_init__(self) -> None:
        object.__setattr__(self, "data_dir", Path(self.data_dir).expanduser().resolve())
        if not self.project:
            raise ValueError("project id must not be empty (STASIS_PROJECT)")

    @classmethod
    def from_env(
        cls, environ: Mapping[str, str] = os.environ, **overrides: object
    ) -> AgentSettings:
        """Settings from ``STASIS_DATA_DIR``, ``STASIS_PROJECT`` and
        ``STASIS_NODE_AGENT_PORT``; keyword overrides win (the command line's flags)."""
        values: dict[str, object] = {
            "data_dir": Path(environ.get("STASIS_DATA_DIR") or ".stasis"),
            "project": environ.get("STASIS_PROJECT") or DEFAULT_PROJECT,
            "port": int(environ.get("STASIS_NODE_AGENT_PORT") or DEFAULT_PORT),
        }
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

    def home(self, workspace_id: str) -> Path:
        return self.homes_dir / workspace_id

    def runtime_dir(self, workspace_id: str) -> Path:
        return self.data_dir / "run" / workspace_id

    def log_path(self, workspace_id: str) -> Path:
        return self.data_dir / "logs" / "workspaces" / f"{workspace_id}.log"
