"""One stack, two runtimes: the workspaces whose id matches a pattern run on the null
runtime, every other one on the stack's own runtime (``STASIS_NULL_RUNTIME_MATCH``, for
benchmarks only: ``bench/load.py --local N`` puts 200 pretend workspaces beside a few real
JupyterLab servers on one control plane).

Routed by the workspace id, not its profile or a catalog field: ``release``, ``destroy``
and ``status`` are given only the id, and routing on anything the router would have to
remember would need state that every function worker shares. The capabilities are the real
runtime's (the stricter: a profile the real node cannot take is refused for both).
"""

from __future__ import annotations

from collections.abc import Mapping
from fnmatch import fnmatchcase
from typing import Any

from functions.ports import Runtime, RuntimeStatus, WorkspaceSpec


class SplitRuntime:
    def __init__(self, real: Runtime, null: Runtime, null_match: str) -> None:
        self.real, self.null, self.null_match = real, null, null_match
        self.name = f"{getattr(real, 'name', 'real')}+null"

    def _for(self, workspace_id: str) -> Runtime:
        return self.null if fnmatchcase(workspace_id, self.null_match) else self.real

    def capabilities(self) -> Mapping[str, Any]:
        return self.real.capabilities()

    def provision(self, spec: WorkspaceSpec) -> None:
        self._for(spec.workspace_id).provision(spec)

    def snapshot(self, spec: WorkspaceSpec, snapshot_id: str, *, base: str | None = None,
                 base_manifest_sha256: str | None = None) -> None:
        self._for(spec.workspace_id).snapshot(spec, snapshot_id, base=base,
                                              base_manifest_sha256=base_manifest_sha256)

    def restore(self, spec: WorkspaceSpec, snapshot_id: str, *,
                manifest_sha256: str | None = None, device_arrays_to_cpu: bool = False) -> None:
        self._for(spec.workspace_id).restore(spec, snapshot_id, manifest_sha256=manifest_sha256,
                                             device_arrays_to_cpu=device_arrays_to_cpu)

    def release(self, workspace_id: str) -> None:
        self._for(workspace_id).release(workspace_id)

    def destroy(self, workspace_id: str, *, keep_home: bool) -> None:
        self._for(workspace_id).destroy(workspace_id, keep_home=keep_home)

    def status(self, workspace_id: str) -> RuntimeStatus | None:
        return self._for(workspace_id).status(workspace_id)

    def list(self) -> list[RuntimeStatus]:
        return [s for s in self.real.list() if self._for(s.workspace_id) is self.real] + [
            s for s in self.null.list() if self._for(s.workspace_id) is self.null]

    def progress(self, workspace_id: str) -> Mapping[str, Any] | None:
        return self._for(workspace_id).progress(workspace_id)
