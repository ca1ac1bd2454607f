"""Settings of the local stack: every port, path and name `stasis up` uses, in one place.

`Settings.from_env()` reads `STASIS_*` variables over sensible defaults, so the CLI, the
supervisor, the test fixtures and the functions running under the local function host all
agree on where everything is. Everything binds to 127.0.0.1: the local stack is never
exposed beyond loopback, so the host is not configurable.

Variables (all optional):

| variable                  | default              |
|---------------------------|----------------------|
| STASIS_PROJECT            | stasis-local         |
| STASIS_DATA_DIR           | ./.stasis (absolute) |
| STASIS_FIRESTORE_PORT     | 8710                 |
| STASIS_PUBSUB_PORT        | 8711                 |
| STASIS_GCS_PORT           | 8712                 |
| STASIS_FUNCTIONS_PORT     | 8713                 |
| STASIS_NODE_AGENT_PORT    | 8714                 |
| STASIS_SLACK_SINK_PORT    | 8715                 |
| STASIS_DASHBOARD_PORT     | 8716 (reserved)      |
| STASIS_SCHEDULER_PORT     | 8717                 |
| STASIS_IDE_PROXY_PORT     | 8718                 |
| STASIS_SNAPSHOT_BUCKET    | stasis-snapshots     |
| STASIS_GCLOUD_SDK_ROOT    | /usr/lib/google-cloud-sdk |
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass, fields, replace
from pathlib import Path
from typing import Any, ClassVar

HOST = "127.0.0.1"

DEFAULT_PROJECT = "stasis-local"
DEFAULT_DATA_DIR = ".stasis"
DEFAULT_SNAPSHOT_BUCKET = "stasis-snapshots"
DEFAULT_SDK_ROOT = "/usr/lib/google-cloud-sdk"
DEFAULT_FUNCTION_WORKERS = 2

# Service name -> default port. The names are also the env suffixes: STASIS_<NAME>_PORT.
DEFAULT_PORTS: Mapping[str, int] = {
    "firestore": 8710,
    "pubsub": 8711,
    "gcs": 8712,
    "functions": 8713,
    "node_agent": 8714,
    "slack_sink": 8715,
    "dashboard": 8716,
    "scheduler": 8717,
    "ide_proxy": 8718,
}


@dataclass(frozen=True)
class Settings:
    """Where every part of the local stack lives. Immutable; derive variants with
    `dataclasses.replace` (the test fixtures do, to move every port off the defaults)."""

    HOST: ClassVar[str] = HOST

    project: str = DEFAULT_PROJECT
    data_dir: Path = Path(DEFAULT_DATA_DIR)
    firestore_port: int = DEFAULT_PORTS["firestore"]
    pubsub_port: int = DEFAULT_PORTS["pubsub"]
    gcs_port: int = DEFAULT_PORTS["gcs"]
    functions_port: int = DEFAULT_PORTS["functions"]
    node_agent_port: int = DEFAULT_PORTS["node_agent"]
    slack_sink_port: int = DEFAULT_PORTS["slack_sink"]
    dashboard_port: int = DEFAULT_PORTS["dashboard"]
    scheduler_port: int = DEFAULT_PORTS["scheduler"]
    ide_proxy_port: int = DEFAULT_PORTS["ide_proxy"]
    snapshot_bucket: str = DEFAULT_SNAPSHOT_BUCKET
    sdk_root: Path = Path(DEFAULT_SDK_ROOT)
    #: gunicorn workers of the function host: processes that share nothing but the
    #: emulators, as Cloud Functions instances do, so two deliveries for one team meet in
    #: Firestore's transactions rather than in one process's lock.
    function_workers: int = DEFAULT_FUNCTION_WORKERS

    def __post_init__(self) -> None:
        if self.function_workers < 1:
            raise ValueError("the function host needs at least 1 worker "
                             f"(STASIS_FUNCTION_WORKERS), got {self.function_workers}")
        if not self.project:
            raise ValueError("project id must not be empty (STASIS_PROJECT)")
        if not self.snapshot_bucket:
            raise ValueError("snapshot bucket must not be empty (STASIS_SNAPSHOT_BUCKET)")
        ports = self.ports()
        for name, port in ports.items():
            if not 1 <= port <= 65535:
                raise ValueError(f"port of {name} out of range 1-65535: {port} ({_port_var(name)})")
        by_port: dict[int, list[str]] = {}
        for name, port in ports.items():
            by_port.setdefault(port, []).append(name)
        clashes = {port: names for port, names in by_port.items() if len(names) > 1}
        if clashes:
            described = "; ".join(
                f"{port}: {', '.join(_port_var(n) for n in names)}"
                for port, names in sorted(clashes.items())
            )
            raise ValueError(f"two services of the local stack share a port: {described}")

    @classmethod
    def from_env(cls, environ: Mapping[str, str] = os.environ) -> Settings:
        """Build settings from `STASIS_*` variables; unset or empty ones take the default.

        The data dir is resolved to an absolute path against the current directory now, so
        the value stays valid for children started with another cwd.
        """

        def get(name: str, default: str) -> str:
            return environ.get(name) or default

        ports: dict[str, int] = {}
        for name, default in DEFAULT_PORTS.items():
            var = _port_var(name)
            raw = get(var, str(default))
            try:
                ports[f"{name}_port"] = int(raw)
            except ValueError:
                raise ValueError(f"{var} must be a port number, got {raw!r}") from None
        return cls(
            project=get("STASIS_PROJECT", DEFAULT_PROJECT),
            data_dir=Path(get("STASIS_DATA_DIR", DEFAULT_DATA_DIR)).expanduser().resolve(),
            snapshot_bucket=get("STASIS_SNAPSHOT_BUCKET", DEFAULT_SNAPSHOT_BUCKET),
            sdk_root=Path(get("STASIS_GCLOUD_SDK_ROOT", DEFAULT_SDK_ROOT)).expanduser(),
            function_workers=_count("STASIS_FUNCTION_WORKERS",
                                    get("STASIS_FUNCTION_WORKERS",
                                        str(DEFAULT_FUNCTION_WORKERS))),
            **ports,
        )

    # -- derived addresses ---------------------------------------------------------------

    @property
    def host(self) -> str:
        """Always loopback."""
        return HOST

    def ports(self) -> dict[str, int]:
        """Service name -> port, for every port the stack owns (including reserved ones)."""
        return {
            f.name.removesuffix("_port"): getattr(self, f.name)
            for f in fields(self)
            if f.name.endswith("_port")
        }

    def with_ports(self, ports: Mapping[str, int]) -> Settings:
        """A copy with the ports of the named services (as in `DEFAULT_PORTS`) replaced."""
        unknown = set(ports) - set(DEFAULT_PORTS)
        if unknown:
            raise KeyError(f"unknown services {sorted(unknown)}; known: {sorted(DEFAULT_PORTS)}")
        changes: dict[str, Any] = {f"{name}_port": port for name, port in ports.items()}
        return replace(self, **changes)

    def address(self, service: str) -> str:
        """`127.0.0.1:PORT` of a service named as in `DEFAULT_PORTS`."""
        try:
            port = self.ports()[service]
        except KeyError:
            raise KeyError(f"unknown service {service!r}; known: {sorted(self.ports())}") from None
        return f"{HOST}:{port}"

    def url(self, service: str) -> str:
        """`http://127.0.0.1:PORT` of a service named as in `DEFAULT_PORTS`."""
        return f"http://{self.address(service)}"

    @property
    def firestore_host(self) -> str:
        return self.address("firestore")

    @property
    def pubsub_host(self) -> str:
        return self.address("pubsub")

    @property
    def gcs_url(self) -> str:
        return self.url("gcs")

    @property
    def functions_url(self) -> str:
        return self.url("functions")

    @property
    def node_agent_url(self) -> str:
        return self.url("node_agent")

    def node_agent_token(self) -> str:
        """The control plane's credential for the node agent (``<data dir>/agent/token``,
        made on first use): the function host and the IDE proxy get it in their
        environment, the CLI reads it here; a workspace never sees it."""
        from runtime.local.settings import control_token

        return control_token(self.data_dir)

    def workspace_key(self) -> str:
        """The key of the workspaces' identities (``<data dir>/agent/workspace_key``): the
        node agent mints each workspace's token with it, the function host checks them."""
        from runtime.local.settings import workspace_key

        return workspace_key(self.data_dir)

    def node_agent_headers(self) -> dict[str, str]:
        """What a call to the node agent carries (``Authorization: Bearer ...``)."""
        return {"Authorization": f"Bearer {self.node_agent_token()}"}

    @property
    def slack_sink_url(self) -> str:
        return self.url("slack_sink")

    @property
    def dashboard_url(self) -> str:
        return self.url("dashboard")

    @property
    def ide_proxy_url(self) -> str:
        """The IDE access proxy: each workspace's IDE at ``/w/<workspace id>/``."""
        return self.url("ide_proxy")

    # -- derived paths -------------------------------------------------------------------

    @property
    def run_dir(self) -> Path:
        """Pid files of the running children, one `<name>.pid` each."""
        return self.data_dir / "run"

    @property
    def log_dir(self) -> Path:
        """Logs of the children, one `<name>.log` each."""
        return self.data_dir / "logs"

    @property
    def gcs_root(self) -> Path:
        """Where fake-gcs-server keeps buckets and objects (filesystem backend)."""
        return self.data_dir / "gcs"

    # -- environment for clients ---------------------------------------------------------

    def emulator_env(self) -> dict[str, str]:
        """The variables a client (a function, the node agent, a test) needs to talk to
        this stack instead of Google Cloud."""
        return {
            "FIRESTORE_EMULATOR_HOST": self.firestore_host,
            "PUBSUB_EMULATOR_HOST": self.pubsub_host,
            "STORAGE_EMULATOR_HOST": self.gcs_url,
            "GOOGLE_CLOUD_PROJECT": self.project,
            "STASIS_PROJECT": self.project,
            "STASIS_SNAPSHOT_BUCKET": self.snapshot_bucket,
            "STASIS_NODE_AGENT_URL": self.node_agent_url,
            "STASIS_FUNCTIONS_URL": self.functions_url,
        }


def _count(var: str, raw: str) -> int:
    try:
        return int(raw)
    except ValueError:
        raise ValueError(f"{var} must be a whole number, got {raw!r}") from None


def _port_var(service: str) -> str:
    return f"STASIS_{service.upper()}_PORT"
