"""The snapshot agent sidecar: the local runtime's kernel snapshots, inside a workspace pod.

    python -m runtime.kubernetes.sidecar                  # serve on $STASIS_AGENT_PORT
    python -m runtime.kubernetes.sidecar install DIR      # init container: copy the
                                                          # in-kernel agent to DIR

It runs next to the IDE in every workspace pod and answers, on the pod's network (the
NetworkPolicy lets only the monitor in), JSON in and out:

    GET  /healthz                 {"ok": true}
    GET  /activity                last_activity, busy_kernels, kernels, connections
    POST /snapshots               {snapshot_id, bucket, prefix, base?, credential?} -> 202
                                  (idempotent per id; base: {prefix, manifest_sha256} of
                                  the snapshot whose parts need not be sent again)
    GET  /snapshots/<id>          state (running, succeeded, failed), uri, bytes, duration_ms,
                                  captured, skipped, manifest_sha256, parts, uploaded_bytes,
                                  error
    POST /restore                 {snapshot_id, bucket, prefix, manifest_sha256,
                                  device_arrays_to_cpu?, credential?} -> 202 (idempotent
                                  per id)
    GET  /restore                 state, snapshot_id, kernels_restored, restore_ms, error,
                                  cause (snapshot_integrity, restore_refused)

Every call but ``/healthz`` must carry ``X-Stasis-Sidecar-Token: $STASIS_SIDECAR_TOKEN`` (the
workspace's Secret, referenced by this container only; the monitor derives it from the
deployment's sidecar key: ``functions.kubernetes.objects.workspace.sidecar_token``). The
IDE's kernels share the pod's network but not that variable, so they cannot start a
restore of another prefix or read a snapshot's progress. Without a token set, the sidecar
refuses every call (401): it never serves unauthenticated.

Snapshots and restores are ``runtime.local.snapshots.take_snapshot``, ``open_snapshot``
(the manifest must hash to the sha256 the control plane recorded, or nothing is read) and
``restore_snapshot``, the node agent's own orchestration, against the Jupyter server on
127.0.0.1 (same pod, same network namespace) with the kernels' connection files from the
shared ``JUPYTER_RUNTIME_DIR``.

Cloud Storage: the pod's own identity has no grant on the snapshot bucket. Each request
carries ``credential: {token, expiry}``, a token the monitor minted for this one operation,
downscoped to the workspace's own snapshot folder (``functions.domain.snapshot_access``);
the sidecar (manifest, staging) and the kernel it drives (parts) use only it. Against real
Cloud Storage (no ``STORAGE_EMULATOR_HOST``) a snapshot or restore without one is refused
(403) before anything runs; fake-gcs-server ignores authentication, so the local stack and
the K3s tests may leave it out. The sidecar keeps no credential of its own and publishes
nothing: the monitor polls it and reports events, so no code in a workspace pod can publish
to Pub/Sub.
"""

from __future__ import annotations

import argparse
import logging
import os
import shutil
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

log = logging.getLogger(__name__)

TOKEN_HEADER = "X-Stasis-Sidecar-Token"
SNAPSHOT_TIMEOUT_S = float(os.environ.get("STASIS_SNAPSHOT_TIMEOUT", "900"))
SOURCE_ROOT = Path(__file__).resolve().parents[2]


@dataclass
class Job:
    """One snapshot or restore, as the monitor reads it."""

    snapshot_id: str
    state: str = "running"
    started: float = field(default_factory=time.monotonic)
    result: dict[str, Any] = field(default_factory=dict)
    error: str | None = None
    cause: str | None = None

    def describe(self) -> dict[str, Any]:
        return {"snapshot_id": self.snapshot_id, "state": self.state, "error": self.error,
                "cause": self.cause, **self.result}


class Agent:
    """The sidecar's operations, behind the HTTP layer (``create_app``).

    ``client`` opens a client for the workspace's server (``JupyterClient`` or
    ``CodeServerClient``); ``take``/``restore`` default to the local runtime's
    orchestration with the default engine, so tests swap in fakes.
    """

    def __init__(self, *, workspace_id: str, client: Callable[[], Any], runtime_dir: Path,
                 take: Callable[..., Any] | None = None,
                 restore: Callable[..., Any] | None = None,
                 timeout: float = SNAPSHOT_TIMEOUT_S,
                 require_credential: bool = False) -> None:
        """``require_credential``: refuse a snapshot or restore whose request carries no
        token (real Cloud Storage, where the pod's identity can do nothing itself)."""
        self.workspace_id = workspace_id
        self.require_credential = require_credential
        self._client = client
        self.runtime_dir = runtime_dir
        self._take = take
        self._restore = restore
        self.timeout = timeout
        self._lock = threading.Lock()
        self.snapshots: dict[str, Job] = {}
        self.restoring: Job | None = None

    def activity(self) -> dict[str, Any]:
        with self._client() as client:
            status = client.status()
            kernels = client.kernels()
        return {"workspace_id": self.workspace_id,
                "last_activity": status.get("last_activity"),
                "started": status.get("started"),
                "busy_kernels": sum(1 for k in kernels if k.get("execution_state") == "busy"),
                "kernels": len(kernels),
                "connections": int(status.get("connections") or 0)}

    def start_snapshot(self, snapshot_id: str, bucket: str, prefix: str,
                       base: dict[str, Any] | None = None, *,
                       access_token: str | None = None) -> Job:
        with self._lock:
            job = self.snapshots.get(snapshot_id)
            if job is not None and job.state != "failed":
                return job
            job = self.snapshots[snapshot_id] = Job(snapshot_id)
        threading.Thread(target=self._run_snapshot,
                         args=(job, bucket, prefix, base, access_token),
                         name=f"snapshot-{snapshot_id}", daemon=True).start()
        return job

    def start_restore(self, snapshot_id: str, bucket: str, prefix: str, *,
                      manifest_sha256: str | None = None,
                      device_arrays_to_cpu: bool = False,
                      access_token: str | None = None) -> Job:
        with self._lock:
            job = self.restoring
            if job is not None and job.snapshot_id == snapshot_id and job.state != "failed":
                return job
            job = self.restoring = Job(snapshot_id)
        threading.Thread(target=self._run_restore,
                         args=(job, bucket, prefix, manifest_sha256, device_arrays_to_cpu,
                               access_token),
                         name=f"restore-{snapshot_id}", daemon=True).start()
        return job

    def _run_snapshot(self, job: Job, bucket: str, prefix: str,
                      base: dict[str, Any] | None, access_token: str | None) -> None:
        try:
            take = self._take or _default_take
            with self._client() as client:
                outcome = take(client, self.runtime_dir, workspace_id=self.workspace_id,
                               snapshot_id=job.snapshot_id, bucket=bucket, prefix=prefix,
                               timeout=self.timeout, base=base, access_token=access_token)
            job.result = {"uri": outcome.uri, "bytes": outcome.bytes,
                          "duration_ms": outcome.duration_ms, "captured": outcome.captured,
                          "skipped": outcome.skipped, "kernels": outcome.kernels,
                          "manifest_sha256": outcome.manifest_sha256, "parts": outcome.parts,
                          "uploaded_bytes": outcome.uploaded_bytes}
            job.state = "succeeded"
        except Exception as exc:  # every failure is reported, none kills the agent
            log.exception("snapshot %s failed", job.snapshot_id)
            job.error, job.state = str(exc) or type(exc).__name__, "failed"

    def _run_restore(self, job: Job, bucket: str, prefix: str, manifest_sha256: str | None,
                     device_arrays_to_cpu: bool, access_token: str | None) -> None:
        try:
            restore = self._restore or _default_restore
            with self._client() as client:
                outcome = restore(client, self.runtime_dir, bucket=bucket, prefix=prefix,
                                  timeout=self.timeout, snapshot_id=job.snapshot_id,
                                  manifest_sha256=manifest_sha256,
                                  device_arrays_to_cpu=device_arrays_to_cpu,
                                  access_token=access_token)
            job.result = {"kernels_restored": outcome.kernels_restored,
                          "sessions_restored": outcome.sessions_restored,
                          "restore_ms": int((time.monotonic() - job.started) * 1000)}
            job.state = "succeeded"
        except Exception as exc:
            log.exception("restore of %s failed", job.snapshot_id)
            job.error, job.state = str(exc) or type(exc).__name__, "failed"
            job.cause = getattr(exc, "cause", None)


def _default_take(client: Any, runtime_dir: Path, *, access_token: str | None,
                  **kwargs: Any) -> Any:
    from runtime.local.snapshots import default_engine, take_snapshot

    return take_snapshot(client, runtime_dir, engine=default_engine(access_token), **kwargs)


def _default_restore(client: Any, runtime_dir: Path, *, bucket: str, prefix: str,
                     timeout: float, snapshot_id: str, manifest_sha256: str | None,
                     device_arrays_to_cpu: bool, access_token: str | None) -> Any:
    from runtime.local.snapshots import default_engine, open_snapshot, restore_snapshot

    engine = default_engine(access_token)
    manifest = open_snapshot(engine, bucket, prefix, snapshot_id=snapshot_id,
                             manifest_sha256=manifest_sha256)
    return restore_snapshot(client, runtime_dir, manifest, engine=engine, bucket=bucket,
                            timeout=timeout, device_arrays_to_cpu=device_arrays_to_cpu)


def create_app(agent: Agent, token: str = "") -> Any:
    import hmac

    from flask import Flask, jsonify, request

    app = Flask(__name__)
    expected = token.encode()

    @app.before_request
    def _only_the_monitor() -> Any:
        if request.path == "/healthz":  # the kubelet's readiness probe
            return None
        # Not Authorization: the API server's pod proxy (a monitor outside the cluster)
        # takes that header for itself.
        given = request.headers.get(TOKEN_HEADER, "").encode()
        if token and hmac.compare_digest(given, expected):
            return None
        return jsonify({"error": "the snapshot agent answers only the monitor "
                                 f"({TOKEN_HEADER}: <the workspace's sidecar token>)"}), 401

    def _body() -> dict[str, Any]:
        body = request.get_json(silent=True)
        if not isinstance(body, dict) or not all(
                isinstance(body.get(k), str) and body.get(k)
                for k in ("snapshot_id", "bucket", "prefix")):
            raise _BadRequest("send JSON with snapshot_id, bucket and prefix")
        return body

    def _token(body: dict[str, Any]) -> str | None:
        """The request's downscoped token; refused where one is required and missing."""
        credential = body.get("credential")
        token = credential.get("token") if isinstance(credential, dict) else None
        if isinstance(token, str) and token:
            return token
        if agent.require_credential:
            raise _Forbidden("a snapshot or restore against Cloud Storage needs the monitor's "
                             "credential for this workspace's folder (credential.token); the "
                             "pod's own identity has no grant on the bucket")
        return None

    @app.errorhandler(_BadRequest)
    def _bad(exc: _BadRequest) -> Any:
        return jsonify({"error": str(exc)}), 400

    @app.errorhandler(_Forbidden)
    def _forbidden(exc: _Forbidden) -> Any:
        return jsonify({"error": str(exc)}), 403

    @app.get("/healthz")
    def healthz() -> Any:
        return jsonify({"ok": True})

    @app.get("/activity")
    def activity() -> Any:
        try:
            return jsonify(agent.activity())
        except Exception as exc:  # the IDE is not up (yet): the monitor asks again later
            return jsonify({"error": str(exc)}), 503

    @app.post("/snapshots")
    def snapshot() -> Any:
        body = _body()
        base = body.get("base")
        job = agent.start_snapshot(body["snapshot_id"], body["bucket"], body["prefix"],
                                   base if isinstance(base, dict) else None,
                                   access_token=_token(body))
        return jsonify(job.describe()), 202

    @app.get("/snapshots/<snapshot_id>")
    def snapshot_status(snapshot_id: str) -> Any:
        job = agent.snapshots.get(snapshot_id)
        if job is None:
            return jsonify({"error": f"no snapshot {snapshot_id} here"}), 404
        return jsonify(job.describe())

    @app.post("/restore")
    def restore() -> Any:
        body = _body()
        anchor = body.get("manifest_sha256")
        job = agent.start_restore(body["snapshot_id"], body["bucket"], body["prefix"],
                                  manifest_sha256=anchor if isinstance(anchor, str) else None,
                                  device_arrays_to_cpu=body.get("device_arrays_to_cpu") is True,
                                  access_token=_token(body))
        return jsonify(job.describe()), 202

    @app.get("/restore")
    def restore_status() -> Any:
        job = agent.restoring
        return jsonify(job.describe() if job else {"state": "none"})

    return app


class _BadRequest(ValueError):
    pass


class _Forbidden(PermissionError):
    pass


def install(target: Path) -> None:
    """Copy the in-kernel agent (``runtime/snapshot``) where kernels import it from."""
    destination = target / "runtime"
    shutil.copytree(SOURCE_ROOT / "runtime" / "snapshot", destination / "snapshot",
                    dirs_exist_ok=True, ignore=shutil.ignore_patterns("__pycache__"))
    shutil.copy2(SOURCE_ROOT / "runtime" / "__init__.py", destination / "__init__.py")


def agent_from_environment() -> Agent:
    from runtime.local.jupyter import CodeServerClient, JupyterClient

    url = os.environ.get("JUPYTER_URL", "http://127.0.0.1:8888")
    token = os.environ.get("JUPYTER_TOKEN", "")
    vscode = os.environ.get("STASIS_IDE_KIND") == "vscode"

    def client() -> Any:
        return CodeServerClient(url) if vscode else JupyterClient(url, token)

    # Real Cloud Storage: only the monitor's downscoped token may be used. fake-gcs-server
    # ignores authentication.
    return Agent(workspace_id=os.environ.get("STASIS_WORKSPACE_ID", ""), client=client,
                 runtime_dir=Path(os.environ.get("JUPYTER_RUNTIME_DIR", "/run/jupyter")),
                 require_credential=not os.environ.get("STORAGE_EMULATOR_HOST"))


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m runtime.kubernetes.sidecar")
    sub = parser.add_subparsers(dest="command")
    install_parser = sub.add_parser("install", help="copy the in-kernel agent to DIR")
    install_parser.add_argument("dir", type=Path)
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, stream=sys.stderr,
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    if args.command == "install":
        install(args.dir)
        return
    from werkzeug.serving import make_server

    port = int(os.environ.get("STASIS_AGENT_PORT", "8890"))
    # The pod's own address: the monitor connects to the pod IP; the NetworkPolicy lets
    # nothing else in.
    server = make_server("0.0.0.0", port,
                         create_app(agent_from_environment(),
                                    os.environ.get("STASIS_SIDECAR_TOKEN", "")),
                         threaded=True)
    log.info("snapshot agent on :%d", port)
    server.serve_forever()


if __name__ == "__main__":
    main()
