"""``NodeAgent``: the operations of the local runtime, behind the HTTP layer.

Synchronous operations (``release``, ``destroy``, the reads) finish before they return.
Asynchronous ones (``provision``, ``snapshot``, ``restore``) are checked and recorded in
the state file, then run on a thread of their own, and report their outcome as an event:
workspace.ready, workspace.runtime_failed or snapshot.finished. The request's
``requestid`` is carried on that event.

Concurrency, per workspace: at most one asynchronous operation is in flight (a second one
is answered "busy", a repeat of the same one is accepted again and changes nothing).
``release`` and ``destroy`` always win: they withdraw the operation and stop the server;
the operation's thread notices at its next step, cleans up what it started and, for a
snapshot, reports the failure (the control plane waits for that one).

Crash recovery (``start``): servers run in their own process groups and outlive the
agent. A restarted agent adopts every recorded server that is still the process it started,
forgets the dead ones, and finishes off interrupted operations: a snapshot is reported
failed ("node agent restarted during the snapshot") once its kernels stopped writing, and
its partial objects are deleted; an interrupted resume is stopped and reported interrupted
(its workspace stays PAUSED), as is a provision whose server died; an interrupted provision
whose server is alive is waited for and reported ready. Each report is saved with the
operation's end, so an agent killed again before sending it sends it at its next start.
A start's marker (``STASIS_SERVER_INSTANCE``) is saved with its operation before the
server exists, so a server the agent spawned but died before recording is stopped too.
"""

from __future__ import annotations

import contextlib
import logging
import os
import re
import shutil
import threading
import time
import uuid
from collections.abc import Callable, Mapping
from datetime import UTC, datetime
from typing import Any

import psutil

from events import (
    SnapshotFinished,
    WorkspaceReady,
    WorkspaceRuntimeFailed,
    crashpoints,
    from_pubsub,
    identity,
    new_event,
    to_pubsub,
)
from events.payloads import WORKSPACE_SEPARATOR
from runtime.local import servers, snapshots, tenancy, userenv
from runtime.local.gpu import GpuProbe
from runtime.local.host import (
    ProfileError,
    assign_devices,
    available_cpus,
    detect_capabilities,
    device_env,
    limits_for,
    refusal,
    wanted_accelerators,
    with_declared,
)
from runtime.local.jupyter import CodeServerClient, JupyterClient, JupyterError
from runtime.local.publisher import Publisher
from runtime.local.servers import ServerError, ServerLaunch, ServerProcess, ServerStartError
from runtime.local.settings import AgentSettings, workspace_key
from runtime.local.snapshots import Engine, SnapshotFailed
from runtime.local.state import AgentLock, Operation, StateFile, WorkspaceRecord
from runtime.local.uids import HostUids, UidTaken
from runtime.local.warm import KERNEL_ENV, WarmPool, targets_of

log = logging.getLogger(__name__)

WORKSPACE_ID = re.compile(r"^[a-z](-?[a-z0-9]){1,39}--[a-z](-?[a-z0-9]){1,39}$")
SNAPSHOT_ID = re.compile(r"^[a-z0-9][a-z0-9-]{0,80}$")
SPEC_FIELDS = (
    "workspace_id",
    "team",
    "owner",
    "name",
    "ide",
    "environment",
    "profile",
    "snapshot_bucket",
    "snapshot_prefix",
    "requestid",
)
RESTARTED_DURING_SNAPSHOT = "node agent restarted during the snapshot"
#: The cause of a start (provision, resume) a restart cut short: it changed nothing of the
#: snapshot or the home, so a resume's workspace stays PAUSED (``functions.domain.lifecycle``).
INTERRUPTED = "interrupted"
_BIND_RACE = ("already in use", "address in use")
_START_ATTEMPTS = 3
# After the deadline a kernel's capture was given, plus this, it no longer writes.
_DEADLINE_SLACK = 5.0


class AgentError(Exception):
    """An operation the agent will not do; ``status`` is its HTTP status."""

    status = 500


class BadRequest(AgentError):
    status = 400


class NotFound(AgentError):
    status = 404


#: Seconds after a start before the warm pool refills: the new workspace's first seconds
#: (a kernel starting, the browser loading JupyterLab) keep the CPUs to themselves.
_REFILL_DELAY = 5.0


class Refused(AgentError):
    """Permanent: retrying will not help (hardware the host lacks, wrong state)."""

    status = 409


class Busy(AgentError):
    """Temporary: another operation on the workspace is in flight; retry later."""

    status = 503


class _Cancelled(Exception):
    """The operation was withdrawn by a release or destroy."""


class NodeAgent:
    def __init__(
        self,
        settings: AgentSettings,
        publisher: Publisher,
        *,
        engine: Engine | None = None,
        capabilities: Mapping[str, Any] | None = None,
        base_env: Mapping[str, str] | None = None,
        clock: Callable[[], datetime] = lambda: datetime.now(UTC),
        isolation: tenancy.Tenancy | None = None,
        uids: HostUids | None = None,
    ) -> None:
        self.settings = settings
        #: Host-wide leases of the workspace users' uids (``runtime.local.uids``).
        self._uids = uids or HostUids(settings.data_dir)
        self.publisher = publisher
        self._engine = engine
        self._capabilities = dict(capabilities) if capabilities is not None else None
        self._base_env = dict(base_env) if base_env is not None else None
        self._clock = clock
        #: Whether workspaces get OS users of their own (probed at ``start``).
        self._tenancy = isolation
        self._state = StateFile(settings.state_path)
        self._lock_file = AgentLock(settings.lock_path)
        self._lock = threading.RLock()
        self._ws_locks: dict[str, threading.Lock] = {}
        self._records: dict[str, WorkspaceRecord] = {}
        self._threads: list[threading.Thread] = []
        self._timers: list[threading.Timer] = []
        self._started = False
        self._gpu = GpuProbe()
        base_env = self._base_env if self._base_env is not None else dict(os.environ)
        self._pool = WarmPool(log_dir=settings.data_dir / "logs" / "warm",
                              base_env=base_env, repo_root=settings.repo_root)
        self._kernel_pool = WarmPool(log_dir=settings.data_dir / "logs" / "warm-kernels",
                                     base_env=base_env, repo_root=settings.repo_root,
                                     module="runtime.local.prekernel", env_allow=KERNEL_ENV)

    # -- life of the agent ---------------------------------------------------------------

    def start(self) -> None:
        """Take the data dir's lock, adopt surviving servers, recover interrupted
        operations. Raises AgentLockError if another agent serves the data dir."""
        self._lock_file.acquire()
        if self._tenancy is None:
            self._tenancy = tenancy.detect(self.settings.repo_root)
        self.settings.homes_dir.mkdir(parents=True, exist_ok=True)
        if self._tenancy.users:
            # Workspace users pass through to their own home; none may list the others.
            os.chmod(self.settings.homes_dir, 0o711)
            # the default environment's, said once here; `stasis status` shows it too
            why = self._tenancy.refusal(servers.resolve_python({}), self.settings.homes_dir)
            if why:
                log.warning("single-tenant on the default environment: %s", why)
        else:  # said once, here; `stasis status` shows it too
            log.warning("single-tenant: %s", self._tenancy.reason)
        self._started = True
        self.recover()

    def close(self, timeout: float = 5.0) -> None:
        """Stop serving; servers keep running (a later agent adopts them)."""
        self.wait_idle(timeout)
        with self._lock:
            for timer in self._timers:
                timer.cancel()
            self._timers.clear()
        self._pool.close()
        self._kernel_pool.close()
        self._lock_file.release()
        self._started = False

    def wait_idle(self, timeout: float = 120.0) -> bool:
        """Wait for every operation thread to end (tests, shutdown)."""
        deadline = time.monotonic() + timeout
        while True:
            with self._lock:
                threads = [t for t in self._threads if t.is_alive()]
                self._threads = threads
            if not threads:
                return True
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                return False
            threads[0].join(remaining)

    @property
    def engine(self) -> Engine:
        if self._engine is None:
            self._engine = snapshots.default_engine()
        return self._engine

    def capabilities(self) -> dict[str, Any]:
        """What the host has (``nvidia-smi``), and the node's name: the control plane counts
        the node's accelerators under it, with those the admin file declares for it; and
        its tenancy (per-workspace users, or single-tenant and why)."""
        if self._capabilities is None:
            self._capabilities = detect_capabilities()
        return {"node": self.settings.node_name, **self._capabilities,
                "tenancy": self.isolation.describe()}

    @property
    def isolation(self) -> tenancy.Tenancy:
        if self._tenancy is None:
            self._tenancy = tenancy.detect(self.settings.repo_root)
        return self._tenancy

    def recover(self) -> None:
        """Adopt the recorded servers still alive, forget dead ones, finish off the
        operations a crash interrupted (each on its own thread)."""
        with self._lock:
            self._records = self._state.load()
            for record in self._records.values():
                self._recover(record)
            self._save()

    def _recover(self, record: WorkspaceRecord) -> None:
        server = record.server
        alive = server is not None and server.is_alive()
        if server is not None and not alive:
            log.info("%s: server pid %d is gone, forgetting it", record.workspace_id, server.pid)
            record.server = None
        elif server is not None:
            log.info(
                "%s: adopted server pid %d on port %d", record.workspace_id, server.pid, server.port
            )
        if record.unsent:  # reports of operations that ended just before the crash
            self._spawn(record.workspace_id, self._send_unsent, record)
        operation = record.operation
        if operation is None:
            return
        if operation.kind == "snapshot":
            self._spawn(record.workspace_id, self._abandon_snapshot, record, operation)
        elif operation.kind == "provision" and alive and server is not None:
            self._spawn(record.workspace_id, self._finish_provision, record, operation, server)
        else:
            # The operation stays recorded until its failure is saved with its end: cleared
            # first, an agent killed again before it published left the workspace waiting
            # in RESUMING for the reconciler (found by the chaos harness).
            self._spawn(
                record.workspace_id,
                self._abandon_start,
                record,
                operation,
                server if alive else None,
            )

    # -- reads ---------------------------------------------------------------------------

    def list(self) -> list[dict[str, Any]]:
        with self._lock:
            return [self._describe(r) for _, r in sorted(self._records.items())]

    def status(self, workspace_id: str) -> dict[str, Any]:
        _check_id(workspace_id)
        with self._lock:
            record = self._records.get(workspace_id)
            if record is None:
                raise NotFound(f"workspace {workspace_id} is not known on this node")
            return self._describe(record)

    def progress(self, workspace_id: str) -> dict[str, Any]:
        """The operation in flight: phase, start, first byte, bytes done and in all (all
        zero but the phase and times for a provision); ``{"phase": None}`` when idle."""
        _check_id(workspace_id)
        with self._lock:
            record = self._records.get(workspace_id)
            if record is None:
                raise NotFound(f"workspace {workspace_id} is not known on this node")
            operation = record.operation
            report = operation.progress() if operation else {"phase": None}
        return {"workspace_id": workspace_id, **report}

    def activity(self, workspace_id: str) -> dict[str, Any]:
        """Activity signals for the idle policy: the server's last activity, how many
        kernels are busy, how many clients are connected, and how busy the GPUs its
        processes use are (None without ``nvidia-smi`` or a GPU process)."""
        server = self._running_server(workspace_id)
        with _client(server, timeout=10) as client:
            try:
                status = client.status()
                kernels = client.kernels()
            except JupyterError as exc:
                raise Busy(f"workspace {workspace_id}: {exc}") from exc
        return {
            "workspace_id": workspace_id,
            "last_activity": status.get("last_activity"),
            "started": status.get("started"),
            "busy_kernels": sum(1 for k in kernels if k.get("execution_state") == "busy"),
            "kernels": len(kernels),
            "connections": int(status.get("connections") or 0),
            "gpu_utilization": self._gpu.utilization(_process_tree(server.pid)),
            "observed_at": self._clock().isoformat(),
        }

    # -- warm pool -----------------------------------------------------------------------

    def pools(self) -> dict[str, Any]:
        """The warm pools: per environment its wanted size and the servers waiting, and
        the same of the warm kernels (``kernels``)."""
        return {**self._pool.status(), "kernels": self._kernel_pool.status()}

    def set_pools(self, body: Mapping[str, Any]) -> dict[str, Any]:
        """``{"environments": [{"id", "python", "warm_pool", "warm_kernels"}, ...]}`` (the
        catalog's): keep that many warm servers, and kernels, per environment (0 stops
        its pool)."""
        environments = body.get("environments")
        if not isinstance(environments, list) or not all(
                isinstance(e, Mapping) for e in environments):
            raise BadRequest("environments must be a list of environment objects")
        for environment in environments:
            for name in ("warm_pool", "warm_kernels"):
                size = environment.get(name, 0)
                if isinstance(size, bool) or not isinstance(size, int) or not 0 <= size <= 16:
                    raise BadRequest(f"environment {environment.get('id')!r}: {name} must "
                                     f"be an integer from 0 to 16, got {size!r}")
        self._pool.configure(targets_of(environments, servers.resolve_python))
        self._kernel_pool.configure(targets_of(environments, servers.resolve_python,
                                               "warm_kernels"))
        self._pool.refill()
        self._kernel_pool.refill()
        return self.pools()

    # -- provision -----------------------------------------------------------------------

    def provision(self, workspace_id: str, body: Mapping[str, Any]) -> dict[str, Any]:
        spec = parse_spec(workspace_id, body)
        self._admit(spec)
        with self._workspace_lock(workspace_id):
            record = self._records.get(workspace_id)
            if record is not None and record.operation is not None:
                if record.operation.kind in ("provision", "restore"):
                    return self._accepted(record, "already starting")
                if record.server is not None and record.server.is_alive():
                    self._spawn(workspace_id, self._publish_ready, record, spec["requestid"])
                    return self._accepted(record, "already running")
            if record is not None and record.server is not None:
                if record.server.is_alive():
                    self._spawn(workspace_id, self._publish_ready, record, spec["requestid"])
                    return self._accepted(record, "already running")
                record.server = None
            operation = Operation("provision", spec["requestid"], time.time(),
                                  marker=uuid.uuid4().hex)
            with self._lock:
                devices = self._devices(workspace_id, spec)
                launch = self._launch(spec, devices, operation)
                if record is None:
                    record = WorkspaceRecord(workspace_id, home=str(launch.home))
                    self._records[workspace_id] = record
                record.spec = dict(spec)
                record.devices = devices
                record.uid = launch.uid
                record.operation = operation
                record.restored_from = None
                record.kernels_restored = 0
                record.restore_ms = None
                self._save()
            self._spawn(workspace_id, self._run_provision, record, operation, launch)
            return self._accepted(record, "starting")

    def _run_provision(
        self, record: WorkspaceRecord, operation: Operation, launch: ServerLaunch
    ) -> None:
        try:
            server = self._start_server(record, operation, launch)
        except _Cancelled:
            log.info("%s: provision withdrawn", record.workspace_id)
            return
        except (ServerError, OSError) as exc:
            failed = WorkspaceRuntimeFailed(
                record.workspace_id, "provision", f"the server did not start: {exc}")
            if not self._end(record, operation, server_gone=True, report=failed):
                self._publish(failed, operation.requestid)
            return
        self._end(record, operation,
                  report=WorkspaceReady(record.workspace_id, server.url, server.handle))

    def _finish_provision(
        self, record: WorkspaceRecord, operation: Operation, server: ServerProcess
    ) -> None:
        """After a restart: the provision's server survived; wait for it and report."""
        try:
            servers.wait_ready(server, timeout=self.settings.start_timeout)
        except ServerError as exc:
            failed = WorkspaceRuntimeFailed(
                record.workspace_id, "provision", f"the server did not start: {exc}")
            if not self._end(record, operation, server_gone=True, report=failed):
                self._publish(failed, operation.requestid)
            return
        self._end(record, operation,
                  report=WorkspaceReady(record.workspace_id, server.url, server.handle))

    def _abandon_start(
        self, record: WorkspaceRecord, operation: Operation, server: ServerProcess | None
    ) -> None:
        """After a restart: a provision whose server died, or a resume (whose kernels
        cannot be trusted half-restored). Stop what is left and report the failure as an
        interruption: nothing of the snapshot or the home was changed."""
        if server is not None and operation.kind == "restore":
            with contextlib.suppress(ServerError):
                servers.stop(server, grace=self.settings.stop_grace)
        if operation.marker:  # a server it spawned, then died before recording it
            with contextlib.suppress(ServerError):
                servers.stop_marked(operation.marker, grace=self.settings.stop_grace)
        kind = "resume" if operation.kind == "restore" else operation.kind
        failed = WorkspaceRuntimeFailed(
            record.workspace_id, kind, f"node agent restarted during the {kind}",
            cause=INTERRUPTED,
        )
        if not self._end(record, operation, server_gone=True, report=failed):
            self._publish(failed, operation.requestid)

    # -- snapshot ------------------------------------------------------------------------

    def snapshot(self, workspace_id: str, body: Mapping[str, Any]) -> dict[str, Any]:
        _check_id(workspace_id)
        snapshot_id = _snapshot_id(body)
        bucket = _required_str(body, "bucket")
        prefix = _required_str(body, "prefix").strip("/")
        requestid = _required_str(body, "requestid")
        base = _base(body)
        with self._workspace_lock(workspace_id):
            record = self._records.get(workspace_id)
            if record is None or record.server is None or not record.server.is_alive():
                raise Refused(f"workspace {workspace_id} is not running on this node")
            current = record.operation
            if current is not None:
                if current.kind == "snapshot" and current.snapshot_id == snapshot_id:
                    return self._accepted(record, "snapshot already in progress")
                raise Busy(f"workspace {workspace_id} is busy: {_describe_op(current)}")
            operation = Operation(
                "snapshot",
                requestid,
                time.time(),
                snapshot_id=snapshot_id,
                bucket=bucket,
                prefix=prefix,
            )
            with self._lock:
                record.operation = operation
                self._save()
            self._spawn(workspace_id, self._run_snapshot, record, operation, record.server, base)
            return self._accepted(record, "snapshot started")

    def _run_snapshot(
        self, record: WorkspaceRecord, operation: Operation, server: ServerProcess,
        base: Mapping[str, Any] | None = None,
    ) -> None:
        assert operation.snapshot_id and operation.bucket and operation.prefix is not None
        began = time.monotonic()
        accelerator, count = _accelerator(record.spec)
        try:
            with _client(server) as client:
                outcome = snapshots.take_snapshot(
                    client,
                    self.settings.runtime_dir(record.workspace_id),
                    engine=self.engine,
                    workspace_id=record.workspace_id,
                    snapshot_id=operation.snapshot_id,
                    bucket=operation.bucket,
                    prefix=operation.prefix,
                    timeout=self.settings.kernel_timeout,
                    now=self._clock,
                    progress=operation.report_progress,
                    base=base,
                )
            payload = SnapshotFinished(
                workspace_id=record.workspace_id,
                snapshot_id=operation.snapshot_id,
                succeeded=True,
                method="kernel",
                uri=outcome.uri,
                bytes=outcome.bytes,
                duration_ms=outcome.duration_ms,
                accelerator=accelerator,
                accelerator_count=count,
                captured=outcome.captured,
                skipped=outcome.skipped,
                manifest_sha256=outcome.manifest_sha256,
                parts=outcome.parts,
                uploaded_bytes=outcome.uploaded_bytes,
            )
        except Exception as exc:
            reason = str(exc) if isinstance(exc, SnapshotFailed) else f"{type(exc).__name__}: {exc}"
            if not isinstance(exc, SnapshotFailed):
                log.exception("%s: snapshot %s failed", record.workspace_id, operation.snapshot_id)
            with self._lock:
                withdrawn = record.operation is not operation
            if withdrawn:
                reason = f"the workspace was released during the snapshot ({reason})"
            payload = _snapshot_failed(record, operation, reason,
                                       duration_ms=int((time.monotonic() - began) * 1000))
        if payload.succeeded:
            record.phases_ms["snapshot"] = {**outcome.phases_ms, "total": _ms_since(began),
                                            "accepted_at_ms": int(operation.started_at * 1000)}
            crashpoints.reach("snapshot.manifest_written")
        if not self._end(record, operation, report=payload):
            self._publish(payload, operation.requestid)

    def _abandon_snapshot(self, record: WorkspaceRecord, operation: Operation) -> None:
        """After a restart: the snapshot's driver died with the old agent. Wait until the
        kernels stopped writing (a capture in the kernel runs on without its driver, until
        the deadline it was given), delete the partial objects, then report the failure.
        Until that deadline a capture queued behind a long user cell could still start, so
        the prefix is swept once more when it has passed."""
        assert operation.snapshot_id and operation.bucket and operation.prefix is not None
        bucket, prefix = operation.bucket, operation.prefix
        deadline = operation.started_at + self.settings.kernel_timeout + _DEADLINE_SLACK
        server = record.server
        if server is not None and server.is_alive():
            with _client(server, timeout=10) as client:
                snapshots.wait_kernels_idle(client, None, max(0.0, deadline - time.time()))
        snapshots.discard_partial(self.engine, bucket, prefix)
        if time.time() < deadline:
            sweep = threading.Timer(
                deadline - time.time(), snapshots.discard_partial, (self.engine, bucket, prefix)
            )
            sweep.daemon = True
            with self._lock:
                self._timers.append(sweep)
            sweep.start()
        failed = _snapshot_failed(record, operation, RESTARTED_DURING_SNAPSHOT)
        if not self._end(record, operation, report=failed):
            self._publish(failed, operation.requestid)

    # -- restore -------------------------------------------------------------------------

    def restore(self, workspace_id: str, body: Mapping[str, Any]) -> dict[str, Any]:
        _check_id(workspace_id)
        snapshot_id = _snapshot_id(body)
        bucket = _required_str(body, "bucket")
        prefix = _required_str(body, "prefix").strip("/")
        raw_spec = body.get("spec")
        if not isinstance(raw_spec, Mapping):
            raise BadRequest("spec must be the workspace's spec (an object)")
        spec = parse_spec(workspace_id, raw_spec)
        _own_snapshot(spec, snapshot_id, bucket, prefix)
        requestid = str(body.get("requestid") or spec["requestid"])
        anchor = _anchor(body)
        self._admit(spec)
        with self._workspace_lock(workspace_id):
            record = self._records.get(workspace_id)
            current = record.operation if record is not None else None
            if record is not None and current is not None:
                if current.kind == "restore" and current.snapshot_id == snapshot_id:
                    return self._accepted(record, "restore already in progress")
                raise Busy(f"workspace {workspace_id} is busy: {_describe_op(current)}")
            if record is not None and record.server is not None:
                if record.server.is_alive():
                    if record.restored_from == snapshot_id:
                        self._spawn(workspace_id, self._publish_ready, record, requestid)
                        return self._accepted(record, "already restored")
                    raise Refused(
                        f"workspace {workspace_id} is running; release it before "
                        f"restoring snapshot {snapshot_id}"
                    )
                record.server = None
            operation = Operation(
                "restore",
                requestid,
                time.time(),
                snapshot_id=snapshot_id,
                bucket=bucket,
                prefix=prefix,
                marker=uuid.uuid4().hex,
            )
            with self._lock:
                devices = self._devices(workspace_id, spec)
                launch = self._launch(spec, devices, operation)
                if record is None:
                    record = WorkspaceRecord(workspace_id, home=str(launch.home))
                    self._records[workspace_id] = record
                record.spec = dict(spec)
                record.devices = devices
                record.uid = launch.uid
                record.operation = operation
                record.restored_from = None
                self._save()
            self._spawn(workspace_id, self._run_restore, record, operation, launch, anchor)
            return self._accepted(record, "restore started")

    def _run_restore(
        self, record: WorkspaceRecord, operation: Operation, launch: ServerLaunch,
        anchor: tuple[str | None, bool] = (None, False),
    ) -> None:
        assert operation.snapshot_id and operation.bucket and operation.prefix is not None
        began = time.monotonic()
        server: ServerProcess | None = None
        manifest_sha256, to_cpu = anchor
        try:
            # Before a server or kernel exists: a manifest that is not the one recorded is
            # refused here, and nothing of the snapshot is ever unpickled.
            manifest = snapshots.open_snapshot(
                self.engine, operation.bucket, operation.prefix,
                snapshot_id=operation.snapshot_id, manifest_sha256=manifest_sha256)
            manifest_ms = _ms_since(began)
            # The snapshot downloads (verified) while the server and its kernels start.
            with snapshots.Staging(self.engine, manifest, bucket=operation.bucket,
                                   root=self.settings.restore_staging,
                                   timeout=self.settings.kernel_timeout,
                                   progress=operation.report_progress,
                                   memory_bytes=launch.limits.memory_bytes,
                                   uid=launch.uid) as staging:
                server = self._start_server(record, operation, launch)
                server_ms = _ms_since(began) - manifest_ms
                crashpoints.reach("restore.server_started")
                with _client(server) as client:
                    outcome = snapshots.restore_snapshot(
                        client,
                        launch.runtime_dir,
                        manifest,
                        engine=self.engine,
                        bucket=operation.bucket,
                        timeout=self.settings.kernel_timeout,
                        progress=operation.report_progress,
                        device_arrays_to_cpu=to_cpu,
                        staged=staging.futures,
                    )
        except _Cancelled:
            log.info("%s: restore withdrawn", record.workspace_id)
            return
        except Exception as exc:
            if not isinstance(exc, SnapshotFailed | ServerError):
                log.exception(
                    "%s: restore of %s failed", record.workspace_id, operation.snapshot_id
                )
            reason = (
                str(exc)
                if isinstance(exc, SnapshotFailed | ServerError)
                else f"{type(exc).__name__}: {exc}"
            )
            if server is not None:
                with contextlib.suppress(ServerError):
                    servers.stop(server, grace=self.settings.stop_grace)
            cause = exc.cause if isinstance(exc, SnapshotFailed) else None
            self._end(record, operation, server_gone=True, report=WorkspaceRuntimeFailed(
                record.workspace_id, "resume", reason, cause=cause))
            return
        restore_ms = int((time.monotonic() - began) * 1000)
        with self._lock:
            if record.operation is not operation:
                return
            record.restored_from = operation.snapshot_id
            record.kernels_restored = outcome.kernels_restored
            record.restore_ms = restore_ms
            record.phases_ms["restore"] = {"manifest": manifest_ms, "server": server_ms,
                                           **outcome.phases_ms, "total": restore_ms}
        self._end(record, operation, report=WorkspaceReady(
            record.workspace_id, server.url, server.handle,
            kernels_restored=outcome.kernels_restored, restore_ms=restore_ms))

    # -- release and destroy -------------------------------------------------------------

    def release(self, workspace_id: str) -> dict[str, Any]:
        """Stop the server and its kernels; the home stays. Idempotent."""
        _check_id(workspace_id)
        with self._workspace_lock(workspace_id):
            record = self._records.get(workspace_id)
            if record is None:
                return {"workspace_id": workspace_id, "released": False, "known": False}
            self._stop(record)
            return {"workspace_id": workspace_id, "released": True, "known": True}

    def destroy(self, workspace_id: str, *, keep_home: bool) -> dict[str, Any]:
        """Stop, delete the home unless ``keep_home``, forget the workspace. Idempotent:
        a home kept by an earlier destroy is deleted by a later one without it."""
        _check_id(workspace_id)
        with self._workspace_lock(workspace_id):
            record = self._records.get(workspace_id)
            if record is not None:
                self._stop(record)
                with self._lock:
                    self._records.pop(workspace_id, None)
                    self._save()
            shutil.rmtree(self.settings.runtime_dir(workspace_id), ignore_errors=True)
            home = self.settings.home(workspace_id)
            if not keep_home and home.exists():
                shutil.rmtree(home)
            if not keep_home and self._tenancy is not None and self._tenancy.users:
                # A kept home keeps its owner's uid leased: no other agent may get it.
                for uid, key in self._uids.held().items():
                    if key == _uid_key(workspace_id):
                        self._uids.release(uid, key)
            return {
                "workspace_id": workspace_id,
                "known": record is not None,
                "home_kept": keep_home and home.exists(),
            }

    def _stop(self, record: WorkspaceRecord) -> None:
        with self._lock:
            server = record.server
            record.operation = None  # withdraws any operation in flight
            self._save()
        if server is not None:
            jupyter = (record.spec or {}).get("ide") == "jupyterlab"
            servers.stop(server, grace=self.settings.release_grace if jupyter
                         else self.settings.stop_grace)
        with self._lock:
            if record.server is server:
                record.server = None
            record.restored_from = None
            record.devices = {}
            self._save()

    # -- helpers -------------------------------------------------------------------------

    def _admit(self, spec: Mapping[str, Any]) -> None:
        why = refusal(spec["profile"], spec["ide"], self._node_capabilities(spec))
        if why is not None:
            raise Refused(why)

    def _node_capabilities(self, spec: Mapping[str, Any]) -> dict[str, Any]:
        """The host's capabilities with the accelerators the admin declared for this node
        (the spec carries them: ``extra.declared_accelerators``)."""
        caps = self.capabilities()
        caps["accelerators"] = with_declared(caps.get("accelerators") or {},
                                             _declared(spec))
        return caps

    def _devices(self, workspace_id: str, spec: Mapping[str, Any]) -> dict[str, list[int]]:
        """The accelerator indices the workspace gets: the lowest that no other workspace
        with a server (or one starting) holds. Called under ``self._lock``."""
        try:
            wanted = wanted_accelerators(spec["profile"])
        except ProfileError as exc:
            raise Refused(str(exc)) from exc
        if not wanted:
            return {}
        pool = self._node_capabilities(spec)["accelerators"]
        held = [r.devices for wsid, r in self._records.items() if wsid != workspace_id and (
            (r.server is not None and r.server.is_alive()) or r.operation is not None)]
        found = assign_devices(wanted, pool, held)
        if isinstance(found, str):
            raise Refused(f"workspace {workspace_id}: {found}")
        return found

    def _launch(self, spec: Mapping[str, Any], devices: Mapping[str, list[int]],
                operation: Operation) -> ServerLaunch:
        workspace_id = spec["workspace_id"]
        try:
            python = servers.resolve_python(spec["environment"])
            limits = limits_for(spec["profile"], available_cpus())
        except (ServerError, ProfileError) as exc:
            raise Refused(str(exc)) from exc
        detected = self.capabilities().get("accelerators") or {}
        extra_env = device_env(devices, _declared(spec),
                               host_has_gpus=any(not k.startswith("tpu") for k in detected))
        uid = self._user(workspace_id, spec, python)
        extra_env.update(self._identity(spec))
        return ServerLaunch(
            workspace_id=workspace_id,
            home=self.settings.home(workspace_id),
            runtime_dir=self.settings.runtime_dir(workspace_id),
            log_path=self.settings.log_path(workspace_id),
            repo_root=self.settings.repo_root,
            python=python,
            limits=limits,
            ide=spec["ide"],
            extra_env=extra_env,
            uid=uid,
            marker=operation.marker or "",
            **({"base_env": self._base_env} if self._base_env is not None else {}),
        )

    def _identity(self, spec: Mapping[str, Any]) -> dict[str, str]:
        """The workspace's only Stasis credential, and where to use it: its token
        (``events.identity``, minted from its id and incarnation under the data dir's
        workspace key) and the ``workspace_api`` function's URL. Nothing without the
        functions' URL (an agent outside a stack)."""
        functions = (self._base_env if self._base_env is not None else os.environ).get(
            "STASIS_FUNCTIONS_URL")
        if not functions:
            return {}
        extra = spec.get("extra") if isinstance(spec.get("extra"), Mapping) else {}
        key = workspace_key(self.settings.data_dir)
        return {identity.TOKEN_VAR: identity.workspace_token(
                    key, spec["workspace_id"], (extra or {}).get("incarnation")),
                identity.URL_VAR: f"{functions.rstrip('/')}/workspace_api"}

    def _user(self, workspace_id: str, spec: Mapping[str, Any], python: str) -> int | None:
        """The workspace's own uid (recorded, else allocated), or None where it cannot have
        one here; Refused when its team, environment or profile requires isolation then.
        Called under ``self._lock``."""
        why = self.isolation.refusal(python, self.settings.homes_dir)
        if why is not None:
            required = tenancy.required_by(spec)
            if required:
                raise Refused(f"{' and '.join(required)} require(s) a workspace isolated in "
                              f"a user of its own, which this node cannot give: {why}")
            return None
        record = self._records.get(workspace_id)
        key = _uid_key(workspace_id)
        try:
            if record is not None and record.uid is not None:
                self._uids.hold(record.uid, key)
                return record.uid
            taken = {r.uid for wsid, r in self._records.items()
                     if wsid != workspace_id and r.uid is not None}
            taken |= tenancy.home_owners(self.settings.homes_dir) - {
                _owner(self.settings.home(workspace_id))}
            return self._uids.claim(key, tenancy.candidates(self.settings.home(workspace_id),
                                                            taken))
        except UidTaken as exc:
            raise Refused(f"no user of its own for {workspace_id} on this host: {exc}") from exc

    def _start_server(
        self, record: WorkspaceRecord, operation: Operation, launch: ServerLaunch
    ) -> ServerProcess:
        """Spawn (recorded at once, so a release or a crash can find it), then wait until
        it answers. Raises _Cancelled when the operation was withdrawn meanwhile."""
        for attempt in range(1, _START_ATTEMPTS + 1):
            with self._lock:
                if record.operation is not operation:
                    raise _Cancelled()
            server = self._adopt_or_spawn(record, launch)
            crashpoints.reach("server.spawned")
            with self._lock:
                if record.operation is not operation:
                    withdrawn = True
                else:
                    withdrawn = False
                    record.server = server
                    self._save()
            if withdrawn:
                servers.stop(server, grace=self.settings.stop_grace)
                raise _Cancelled()
            try:
                seconds = servers.wait_ready(server, timeout=self.settings.start_timeout)
            except ServerStartError as exc:
                with self._lock:
                    if record.server is server:
                        record.server = None
                        self._save()
                    if record.operation is not operation:
                        raise _Cancelled() from exc
                if attempt < _START_ATTEMPTS and any(w in str(exc).lower() for w in _BIND_RACE):
                    continue
                raise
            log.info(
                "%s: server pid %d ready on port %d in %.2fs",
                record.workspace_id,
                server.pid,
                server.port,
                seconds,
            )
            return server
        raise AssertionError("unreachable")

    def _adopt_or_spawn(self, record: WorkspaceRecord, launch: ServerLaunch) -> ServerProcess:
        """A warm server of the workspace's environment made its own, else a cold start;
        and a warm kernel of the environment handed over for the server's first kernel."""
        environment = (record.spec or {}).get("environment") or {}
        env_id = str(environment.get("id") or "")
        warm = (self._pool.take(env_id, launch.python)
                if launch.ide == "jupyterlab" else None)
        server = None
        if warm is not None:
            try:
                server = servers.adopt(warm, launch)
                log.info("%s: adopted warm server pid %d", record.workspace_id, warm.pid)
            except ServerStartError as exc:
                log.warning("%s: %s; starting cold", record.workspace_id, exc)
        if server is None:
            server = servers.spawn(launch)
        kernel = (self._kernel_pool.take(env_id, launch.python)
                  if launch.ide == "jupyterlab" and userenv.claims_warm_kernels(launch.home)
                  else None)
        if kernel is not None:
            servers.hand_kernel(kernel, launch, server)
            log.info("%s: handed warm kernel pid %d over", record.workspace_id, kernel.pid)
        return server

    def _end(
        self, record: WorkspaceRecord, operation: Operation, *, server_gone: bool = False,
        report: Any = None,
    ) -> bool:
        """Clear the operation if it is still the current one; False if it was withdrawn.

        ``report`` (the payload that says how it ended) is kept in the record by the same
        save that ends the operation, then published: a crash between the two is repaired
        by the next start, which sends what is unsent (the control plane's ledger makes a
        second copy harmless). Ending first and publishing after lost the report: the
        restarted agent saw no operation and a live server, and the workspace waited in
        PROVISIONING for the reconciler. The warm pool refills afterwards, so its warming
        never slows this operation."""
        self._pool.refill(delay=_REFILL_DELAY)
        self._kernel_pool.refill(delay=_REFILL_DELAY)
        with self._lock:
            if record.operation is not operation:
                return False
            record.operation = None
            if server_gone:
                record.server = None
            if report is not None:
                data, attributes = to_pubsub(new_event(
                    report, source=self.settings.event_source, requestid=operation.requestid))
                record.unsent.append({"data": data.decode(), "attributes": attributes})
            self._save()
        crashpoints.reach("agent.operation_ended")
        self._send_unsent(record)
        return True

    def _send_unsent(self, record: WorkspaceRecord) -> None:
        """Publish the record's unsent reports in order; what fails waits for the next
        start of the agent."""
        with self._lock:
            pending = list(record.unsent)
        for message in pending:
            try:
                self.publisher.publish(from_pubsub(message["data"].encode(),
                                                   message["attributes"]))
            except Exception:
                log.exception("%s: could not publish a report; the next start sends it",
                              record.workspace_id)
                return
            with self._lock:
                if message in record.unsent:
                    record.unsent.remove(message)
                self._save()

    def _publish_ready(self, record: WorkspaceRecord, requestid: str) -> None:
        server = record.server
        if server is None:
            return
        self._publish(
            WorkspaceReady(
                record.workspace_id,
                server.url,
                server.handle,
                kernels_restored=record.kernels_restored,
                restore_ms=record.restore_ms,
            ),
            requestid,
        )

    def _publish(self, payload: Any, requestid: str) -> None:
        try:
            event = new_event(payload, source=self.settings.event_source, requestid=requestid)
            self.publisher.publish(event)
        except Exception:
            log.exception(
                "could not publish %s for %s",
                type(payload).__name__,
                getattr(payload, "workspace_id", "?"),
            )

    def _spawn(self, workspace_id: str, target: Callable[..., None], *args: Any) -> None:
        def run() -> None:
            try:
                target(*args)
            except Exception:
                log.exception("%s: %s failed", workspace_id, target.__name__)

        thread = threading.Thread(target=run, name=f"{target.__name__}:{workspace_id}", daemon=True)
        with self._lock:
            self._threads.append(thread)
        thread.start()

    def _workspace_lock(self, workspace_id: str) -> threading.Lock:
        with self._lock:
            return self._ws_locks.setdefault(workspace_id, threading.Lock())

    def _running_server(self, workspace_id: str) -> ServerProcess:
        _check_id(workspace_id)
        with self._lock:
            record = self._records.get(workspace_id)
            server = record.server if record is not None else None
        if record is None:
            raise NotFound(f"workspace {workspace_id} is not known on this node")
        if server is None or not server.is_alive():
            raise Refused(f"workspace {workspace_id} is not running on this node")
        return server

    def _save(self) -> None:
        with self._lock:
            self._state.save(self._records)

    def _accepted(self, record: WorkspaceRecord, detail: str) -> dict[str, Any]:
        return {"workspace_id": record.workspace_id, "accepted": True, "detail": detail}

    def _describe(self, record: WorkspaceRecord) -> dict[str, Any]:
        server = record.server
        running = server is not None and server.is_alive()
        operation = record.operation
        return {
            "workspace_id": record.workspace_id,
            "running": running,
            "pid": server.pid if running and server else None,
            "port": server.port if running and server else None,
            "url": server.url if running and server else None,
            "token": server.token if running and server else None,
            "runtime_handle": server.handle if running and server else None,
            "started_at": (
                datetime.fromtimestamp(server.started_at, UTC).isoformat()
                if running and server
                else None
            ),
            "operation": operation.kind if operation else None,
            "operation_detail": operation.to_json() if operation else None,
            "progress": {"done_bytes": operation.done_bytes, "total_bytes": operation.total_bytes}
            if operation else None,
            "home": record.home,
            "ide": record.spec.get("ide"),
            "profile": (record.spec.get("profile") or {}).get("id"),
            "restored_from": record.restored_from,
            "uid": record.uid,
            "isolated": record.uid is not None,
            "node": self.settings.node_name,
            "devices": record.devices,
            "declared": sorted(k for k in record.devices if k in _declared(record.spec)),
            "phases_ms": record.phases_ms,
        }


def parse_spec(workspace_id: str, body: Mapping[str, Any]) -> dict[str, Any]:
    """The WorkspaceSpec JSON of a request, checked; BadRequest names what is wrong."""
    _check_id(workspace_id)
    if not isinstance(body, Mapping):
        raise BadRequest("the body must be a workspace spec (a JSON object)")
    missing = [f for f in SPEC_FIELDS if body.get(f) in (None, "")]
    if missing:
        raise BadRequest(f"the workspace spec lacks {', '.join(missing)}")
    if body["workspace_id"] != workspace_id:
        raise BadRequest(f"the spec is for workspace {body['workspace_id']}, not {workspace_id}")
    for name in ("environment", "profile"):
        if not isinstance(body[name], Mapping):
            raise BadRequest(f"{name} must be an object")
    extra = body.get("extra") or {}
    if not isinstance(extra, Mapping):
        raise BadRequest("extra must be an object")
    spec = {f: body[f] for f in SPEC_FIELDS}
    spec["environment"] = dict(body["environment"])
    spec["profile"] = dict(body["profile"])
    spec["extra"] = dict(extra)
    return spec


def _ms_since(began: float) -> int:
    return int((time.monotonic() - began) * 1000)


def _uid_key(workspace_id: str) -> str:
    """What a workspace's host-wide uid lease is held for."""
    return f"workspace:{workspace_id}"


def _owner(path: Any) -> int | None:
    try:
        return int(os.stat(path).st_uid)
    except OSError:
        return None


def _check_id(workspace_id: str) -> None:
    if not WORKSPACE_ID.fullmatch(workspace_id or ""):
        raise BadRequest(f"not a workspace id: {workspace_id!r} (expected <team>--<name>)")


def _own_snapshot(spec: Mapping[str, Any], snapshot_id: str, bucket: str, prefix: str) -> None:
    """A workspace restores only its own snapshots: ``snapshots/<team>/<workspace>/<id>`` in
    its own bucket, the team being the workspace id's (never a path the body chose)."""
    workspace_id = spec["workspace_id"]
    team = workspace_id.split(WORKSPACE_SEPARATOR, 1)[0]
    own = f"snapshots/{team}/{workspace_id}/{snapshot_id}"
    if prefix != own or bucket != spec["snapshot_bucket"]:
        raise Refused(f"workspace {workspace_id} restores only its own snapshots "
                      f"(gs://{spec['snapshot_bucket']}/{own}), not gs://{bucket}/{prefix}")


def _snapshot_id(body: Mapping[str, Any]) -> str:
    value = _required_str(body, "snapshot_id")
    if not SNAPSHOT_ID.match(value):
        raise BadRequest(f"not a snapshot id: {value!r} (lowercase letters, digits, dashes)")
    return value


def _base(body: Mapping[str, Any]) -> dict[str, Any] | None:
    """The snapshot a snapshot request follows (``{"snapshot_id", "prefix",
    "manifest_sha256"}``), or None."""
    base = body.get("base")
    if base is None:
        return None
    if not isinstance(base, Mapping) or not isinstance(base.get("prefix"), str):
        raise BadRequest("base must be {snapshot_id, prefix, manifest_sha256}")
    return {"snapshot_id": base.get("snapshot_id"), "prefix": base["prefix"],
            "manifest_sha256": _sha256(base.get("manifest_sha256"), "base.manifest_sha256")}


def _anchor(body: Mapping[str, Any]) -> tuple[str | None, bool]:
    """A restore's manifest sha256 (what the control plane recorded) and whether device
    arrays go to CPU."""
    to_cpu = body.get("device_arrays_to_cpu", False)
    if not isinstance(to_cpu, bool):
        raise BadRequest("device_arrays_to_cpu must be true or false")
    return _sha256(body.get("manifest_sha256"), "manifest_sha256"), to_cpu


def _sha256(value: Any, name: str) -> str | None:
    if value is None:
        return None
    if not isinstance(value, str) or not re.fullmatch(r"[0-9a-f]{64}", value):
        raise BadRequest(f"{name} must be a sha256 (64 lowercase hex digits)")
    return value


def _required_str(body: Mapping[str, Any], name: str) -> str:
    if not isinstance(body, Mapping):
        raise BadRequest("the body must be a JSON object")
    value = body.get(name)
    if not isinstance(value, str) or not value.strip():
        raise BadRequest(f"{name} is required (a non-empty string)")
    return value


def _declared(spec: Mapping[str, Any]) -> dict[str, int]:
    """The accelerators the admin declared for this node, as the spec carries them."""
    extra = spec.get("extra") or {}
    declared = extra.get("declared_accelerators") if isinstance(extra, Mapping) else None
    if not isinstance(declared, Mapping):
        return {}
    return {str(k): int(v) for k, v in declared.items() if isinstance(v, int) and v > 0}


def _snapshot_failed(record: WorkspaceRecord, operation: Operation, error: str, *,
                     duration_ms: int = 0) -> SnapshotFinished:
    accelerator, count = _accelerator(record.spec)
    return SnapshotFinished(workspace_id=record.workspace_id,
                            snapshot_id=str(operation.snapshot_id), succeeded=False,
                            method="kernel", accelerator=accelerator, accelerator_count=count,
                            error=error, duration_ms=duration_ms)


def _accelerator(spec: Mapping[str, Any]) -> tuple[str | None, int]:
    try:
        wanted = wanted_accelerators(spec.get("profile") or {})
    except ProfileError:
        return None, 0
    if not wanted:
        return None, 0
    kind, count = next(iter(wanted.items()))
    return kind, count


def _describe_op(operation: Operation) -> str:
    what = operation.kind + (f" {operation.snapshot_id}" if operation.snapshot_id else "")
    return f"{what} in progress since {datetime.fromtimestamp(operation.started_at, UTC):%H:%M:%S}"


def _process_tree(pid: int) -> list[int]:
    """``pid`` and every process under it (a workspace's server, kernels, terminals)."""
    try:
        root = psutil.Process(pid)
        return [pid, *(p.pid for p in root.children(recursive=True))]
    except psutil.Error:
        return [pid]


def _client(server: ServerProcess, timeout: float = 30.0) -> Any:
    """The REST client for a workspace's server: Jupyter's, or code-server's (no kernels)."""
    if server.ide == "vscode":
        return CodeServerClient(server.base_url, timeout=timeout)
    return JupyterClient(server.base_url, server.token, timeout=timeout)
