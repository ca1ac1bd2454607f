"""The node agent's HTTP layer and entry point.

    python -m runtime.local.agent --port 8714 --data-dir .stasis

reads PUBSUB_EMULATOR_HOST / STORAGE_EMULATOR_HOST / STASIS_PROJECT from the environment
and serves, on 127.0.0.1 only (JSON in and out; errors are ``{"error": message}``):

    GET    /healthz                         {"ok": true}
    GET    /capabilities                    runtime, cpus, memory_bytes, accelerators, ides
    GET    /workspaces                      every known workspace (see GET one)
    GET    /pools                           the warm pool: per environment size and waiting
    PUT    /pools                           {environments: [{id, python, warm_pool}]} -> 200
    PUT    /workspaces/<id>                 body: WorkspaceSpec -> 202; workspace.ready
    GET    /workspaces/<id>                 running, pid, port, url, token, operation, ...
    GET    /workspaces/<id>/activity        last_activity, busy_kernels, connections
    GET    /workspaces/<id>/progress        the operation in flight: phase, started_at,
                                            first_byte_at, done_bytes, total_bytes
    POST   /workspaces/<id>/snapshot        {snapshot_id, bucket, prefix, requestid} -> 202;
                                            snapshot.finished
    POST   /workspaces/<id>/release         stop server and kernels, keep home -> 200
    POST   /workspaces/<id>/restore         {snapshot_id, bucket, prefix, spec, requestid}
                                            -> 202; workspace.ready or runtime_failed
    DELETE /workspaces/<id>?keep_home=true  stop, delete home unless kept, forget -> 200
    ...    /sandboxes[/<id>]                agent sandboxes (see ``runtime.local.sandboxes``)

Every call but ``/healthz`` must carry the control plane's credential, ``Authorization:
Bearer <token>`` (``AgentSettings.control_token``): without it the answer is 401 and
nothing is done or told (a workspace's Jupyter token least of all).

Status codes: 400 a malformed request, 401 not the control plane, 404 an unknown
workspace, 409 a permanent refusal (hardware the host lacks, a workspace that is not
running, a snapshot that is not the workspace's own), 503 busy with another
operation (retry later), 500 an unexpected failure. This module only translates; the
decisions are in ``node``.
"""

from __future__ import annotations

import argparse
import hmac
import logging
import signal
import sys
import threading
from pathlib import Path
from typing import Any

from flask import Flask, jsonify, request
from werkzeug.exceptions import HTTPException
from werkzeug.serving import BaseWSGIServer, make_server

from runtime.local.node import AgentError, BadRequest, NodeAgent
from runtime.local.publisher import NODE_AGENT, Publisher, PubSubPublisher
from runtime.local.sandboxes import register_sandboxes
from runtime.local.settings import HOST, AgentSettings

log = logging.getLogger(__name__)

_TRUE = ("1", "true", "yes", "on")
_FALSE = ("0", "false", "no", "off", "")


def create_app(
    settings: AgentSettings,
    *,
    agent: NodeAgent | None = None,
    publisher: Publisher | None = None,
) -> Flask:
    """The agent's Flask app. Without ``agent``, one is built (publishing to Pub/Sub
    unless ``publisher`` is given) and started: lock taken, servers adopted."""
    if agent is None:
        agent = NodeAgent(settings, publisher or PubSubPublisher(
            settings.project, origin=NODE_AGENT))
        agent.start()
    node = agent
    app = Flask(__name__)
    app.config["agent"] = node
    expected = f"Bearer {settings.control_token()}".encode()

    @app.before_request
    def _only_the_control_plane() -> Any:
        if request.path == "/healthz":  # readiness probes carry no credential
            return None
        given = request.headers.get("Authorization", "").encode()
        if hmac.compare_digest(given, expected):
            return None
        return jsonify(error="the node agent answers only the control plane: "
                             "Authorization: Bearer <the token in the data dir's "
                             "agent/token>"), 401

    @app.errorhandler(AgentError)
    def _agent_error(exc: AgentError) -> Any:
        return jsonify(error=str(exc)), exc.status

    @app.errorhandler(HTTPException)
    def _http_error(exc: HTTPException) -> Any:
        return jsonify(error=exc.description or exc.name), exc.code or 500

    @app.errorhandler(Exception)
    def _unexpected(exc: Exception) -> Any:
        log.exception("%s %s failed", request.method, request.path)
        return jsonify(error=f"{type(exc).__name__}: {exc}"), 500

    @app.get("/healthz")
    def healthz() -> Any:
        return jsonify(ok=True)

    @app.get("/capabilities")
    def capabilities() -> Any:
        return jsonify(node.capabilities())

    @app.get("/pools")
    def pools() -> Any:
        return jsonify(node.pools())

    @app.put("/pools")
    def set_pools() -> Any:
        return jsonify(node.set_pools(_body()))

    @app.get("/workspaces")
    def list_workspaces() -> Any:
        return jsonify(workspaces=node.list())

    @app.put("/workspaces/<workspace_id>")
    def provision(workspace_id: str) -> Any:
        return jsonify(node.provision(workspace_id, _body())), 202

    @app.get("/workspaces/<workspace_id>")
    def status(workspace_id: str) -> Any:
        return jsonify(node.status(workspace_id))

    @app.get("/workspaces/<workspace_id>/activity")
    def activity(workspace_id: str) -> Any:
        return jsonify(node.activity(workspace_id))

    @app.get("/workspaces/<workspace_id>/progress")
    def progress(workspace_id: str) -> Any:
        return jsonify(node.progress(workspace_id))

    @app.post("/workspaces/<workspace_id>/snapshot")
    def snapshot(workspace_id: str) -> Any:
        return jsonify(node.snapshot(workspace_id, _body())), 202

    @app.post("/workspaces/<workspace_id>/release")
    def release(workspace_id: str) -> Any:
        return jsonify(node.release(workspace_id))

    @app.post("/workspaces/<workspace_id>/restore")
    def restore(workspace_id: str) -> Any:
        return jsonify(node.restore(workspace_id, _body())), 202

    @app.delete("/workspaces/<workspace_id>")
    def destroy(workspace_id: str) -> Any:
        raw = request.args.get("keep_home", "false").lower()
        if raw not in _TRUE + _FALSE:
            raise BadRequest(f"keep_home must be true or false, got {raw!r}")
        return jsonify(node.destroy(workspace_id, keep_home=raw in _TRUE))

    register_sandboxes(app, settings, getattr(node, "publisher", None))  # /sandboxes/...
    return app


def _body() -> dict[str, Any]:
    data = request.get_json(silent=True)
    if not isinstance(data, dict):
        raise BadRequest("the body must be a JSON object (Content-Type: application/json)")
    return data


def serve(settings: AgentSettings, app: Flask) -> BaseWSGIServer:
    """A threaded werkzeug server for the app on 127.0.0.1 (not yet serving)."""
    return make_server(HOST, settings.port, app, threaded=True)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m runtime.local.agent", description="The Stasis node agent (local runtime)."
    )
    parser.add_argument(
        "--port", type=int, default=None, help="default: STASIS_NODE_AGENT_PORT or 8714"
    )
    parser.add_argument(
        "--data-dir", type=Path, default=None, help="default: STASIS_DATA_DIR or ./.stasis"
    )
    parser.add_argument("--project", default=None, help="default: STASIS_PROJECT")
    parser.add_argument("--log-level", default="INFO")
    args = parser.parse_args(argv)
    logging.basicConfig(
        level=args.log_level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s"
    )
    settings = AgentSettings.from_env(data_dir=args.data_dir, port=args.port, project=args.project)
    publisher = PubSubPublisher(settings.project, origin=NODE_AGENT)
    agent = NodeAgent(settings, publisher)
    # connected beside the start, so the first workspace's outcome leaves as fast as the next
    threading.Thread(target=publisher.warm, name="publisher-warm-up", daemon=True).start()
    try:
        agent.start()
    except Exception as exc:
        print(f"node agent: {exc}", file=sys.stderr)
        return 1
    try:
        server = serve(settings, create_app(settings, agent=agent))
    except OSError as exc:
        print(f"node agent: cannot listen on {settings.url}: {exc}", file=sys.stderr)
        agent.close()
        return 1

    def stop(signum: int, _frame: object) -> None:
        log.info("signal %d: stopping the node agent (servers keep running)", signum)
        threading.Thread(target=server.shutdown, daemon=True).start()

    signal.signal(signal.SIGTERM, stop)
    signal.signal(signal.SIGINT, stop)
    log.info(
        "node agent serving %s on %s (project %s)",
        settings.data_dir,
        settings.url,
        settings.project,
    )
    try:
        server.serve_forever()
    finally:
        server.server_close()
        agent.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
