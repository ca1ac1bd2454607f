"""Issue 17 §5 on GKE: a workspace's snapshot agent may write only its own snapshot folder.

The boundary (``functions/domain/snapshot_access.py``), the token google-auth exchanges for it
(``runtime/kubernetes/snapshot_tokens.py``: the STS request is answered here, nothing calls
Google), the monitor that sends it with every kernel snapshot and restore, the sidecar that
refuses a request without it against real Cloud Storage, and the store that uses only it.
"""

from __future__ import annotations

import json
import threading
from datetime import UTC, datetime, timedelta
from pathlib import Path
from types import SimpleNamespace
from typing import Any
from urllib.parse import parse_qs, unquote

import pytest
from google.auth import credentials as google_credentials

from functions.domain import snapshot_access
from functions.domain.retention import snapshot_prefix, workspace_root
from functions.kubernetes.objects.meta import (
    ANN_OPERATION,
    ANN_REQUESTID,
    ANN_RESTORE_REQUEST,
    ANN_SNAPSHOT_REQUEST,
    ANN_WORKSPACE_ID,
    MANAGED_BY,
    STASIS,
)
from functions.kubernetes.objects.workspace import sidecar_token
from runtime.kubernetes.monitor import Monitor
from runtime.kubernetes.sidecar import Agent, create_app
from runtime.kubernetes.snapshot_tokens import DownscopedTokens, EmulatorTokens
from runtime.local.publisher import RecordingPublisher
from runtime.snapshot import layout

BUCKET = "stasis-snapshots"
WS = "ml-a--nb"
PREFIX = snapshot_prefix(WS, "ml-a--nb-v3").rstrip("/")
BASE = snapshot_prefix(WS, "ml-a--nb-v2").rstrip("/")
OBJECTS = f"projects/_/buckets/{BUCKET}/objects/"


# -- the boundary (pure) ----------------------------------------------------------------------


def test_a_snapshots_boundary_is_its_workspaces_folder() -> None:
    [rule] = snapshot_access.boundary(BUCKET, WS, PREFIX, "snapshot", base_prefix=BASE)
    assert rule.resource == f"//storage.googleapis.com/projects/_/buckets/{BUCKET}"
    assert rule.permissions == ("inRole:roles/storage.objectAdmin",)
    assert rule.expression == (
        f"resource.name.startsWith('{OBJECTS}snapshots/ml-a/ml-a--nb/') || "
        "api.getAttribute('storage.googleapis.com/objectListPrefix', '')"
        ".startsWith('snapshots/ml-a/ml-a--nb/')")


def test_the_folder_holds_the_snapshot_its_base_and_their_part_pool() -> None:
    """An incremental capture reads its base's manifest and reuses the base's parts: both
    are under the same workspace folder, so the one prefix condition admits them."""
    root = workspace_root(WS)
    [rule] = snapshot_access.boundary(BUCKET, WS, PREFIX, "snapshot", base_prefix=BASE)
    for name in (f"{PREFIX}/manifest.json", f"{BASE}/manifest.json",
                 f"{layout.pool_prefix(PREFIX)}/0123abcd", f"{layout.pool_prefix(BASE)}/ff"):
        assert name.startswith(root)
        assert f"startsWith('{OBJECTS}{root}')" in rule.expression
    assert layout.pool_prefix(PREFIX) == layout.pool_prefix(BASE) == f"{root}_parts"


@pytest.mark.parametrize("prefix", [
    "snapshots/ml-a/ml-a--other/s1",       # a teammate's workspace
    "snapshots/ml-a/ml-a--nb2/s1",         # a workspace whose id starts with this one's
    "snapshots/ml-b/ml-a--nb/s1",          # the same name under another team
    "snapshots/ml-a/pod/ps-1",             # the team's Pod Snapshots
    "snapshots/ml-a/ml-a--nb",             # the folder itself, not a snapshot in it
    "snapshots/ml-a/ml-a--nb/../ml-a--other/s1",
    "snapshots/ml-a/ml-a--nb/s1') || true || ('",
    "",
])
def test_a_prefix_outside_the_workspace_is_refused(prefix: str) -> None:
    for operation in ("snapshot", "restore"):
        with pytest.raises(snapshot_access.OutsideWorkspace):
            snapshot_access.boundary(BUCKET, WS, prefix, operation)  # type: ignore[arg-type]


def test_a_base_of_another_workspace_is_refused() -> None:
    with pytest.raises(snapshot_access.OutsideWorkspace, match="ml-a--other"):
        snapshot_access.boundary(BUCKET, WS, PREFIX, "snapshot",
                                 base_prefix="snapshots/ml-a/ml-a--other/s0")


def test_a_bucket_name_cannot_end_the_expression() -> None:
    with pytest.raises(ValueError, match="bucket"):
        snapshot_access.boundary("b') || true || ('", WS, PREFIX, "snapshot")


def test_a_restore_only_reads_and_lists_nothing() -> None:
    [rule] = snapshot_access.boundary(BUCKET, WS, PREFIX, "restore")
    assert rule.permissions == ("inRole:roles/storage.objectViewer",)
    assert rule.expression == f"resource.name.startsWith('{OBJECTS}snapshots/ml-a/ml-a--nb/')"
    assert "objectListPrefix" not in rule.expression


# -- the token (google-auth, STS answered here) -----------------------------------------------


class SourceCredentials(google_credentials.Credentials):
    """The monitor's own credential (on GKE its Workload Identity's metadata token)."""

    def __init__(self) -> None:
        super().__init__()  # type: ignore[no-untyped-call]
        self.refreshed = 0

    def refresh(self, request: Any) -> None:
        self.refreshed += 1
        self.token = f"monitor-token-{self.refreshed}"
        self.expiry = datetime.now(UTC).replace(tzinfo=None) + timedelta(hours=1)


class STS:
    """A google.auth transport ``Request`` that answers the Security Token Service."""

    def __init__(self) -> None:
        self.calls: list[dict[str, Any]] = []

    def __call__(self, url: str, method: str = "GET", body: Any = None,
                 headers: Any = None, **kwargs: Any) -> Any:
        form = {k: v[0] for k, v in parse_qs(body.decode() if isinstance(body, bytes)
                                             else body).items()}
        self.calls.append({"url": url, "method": method, "form": form})
        data = json.dumps({"access_token": f"downscoped-{len(self.calls)}",
                           "issued_token_type": "urn:ietf:params:oauth:token-type:access_token",
                           "token_type": "Bearer", "expires_in": 3600}).encode()
        return SimpleNamespace(status=200, data=data, headers={})

    def boundary(self, call: int = -1) -> dict[str, Any]:
        # google-auth quotes the options before it form-encodes the request
        options: dict[str, Any] = json.loads(unquote(self.calls[call]["form"]["options"]))
        return options


def test_the_token_is_exchanged_for_the_boundary() -> None:
    source, sts = SourceCredentials(), STS()
    rules = snapshot_access.boundary(BUCKET, WS, PREFIX, "snapshot")
    credential = DownscopedTokens(source, sts).mint(rules)
    assert credential["token"] == "downscoped-1"
    assert datetime.fromisoformat(credential["expiry"]) > datetime.now(UTC)
    [call] = sts.calls
    assert (call["url"], call["method"]) == ("https://sts.googleapis.com/v1/token", "POST")
    assert call["form"]["grant_type"] == "urn:ietf:params:oauth:grant-type:token-exchange"
    assert call["form"]["subject_token"] == "monitor-token-1"
    assert sts.boundary() == {"accessBoundary": {"accessBoundaryRules": [{
        "availableResource": rules[0].resource,
        "availablePermissions": ["inRole:roles/storage.objectAdmin"],
        "availabilityCondition": {"expression": rules[0].expression,
                                  "title": "workspace-snapshot-folder"}}]}}


def test_the_emulator_builds_the_boundary_and_sends_no_token() -> None:
    assert EmulatorTokens().mint(snapshot_access.boundary(BUCKET, WS, PREFIX, "restore")) is None


# -- the monitor sends it ----------------------------------------------------------------------


class Cluster:
    def __init__(self, pods: list[dict[str, Any]]) -> None:
        self._pods = pods

    def pods(self) -> list[dict[str, Any]]:
        return self._pods

    def triggers(self) -> list[dict[str, Any]]:
        return []

    def podsnapshot(self, namespace: str, name: str) -> dict[str, Any] | None:
        return None


class Sidecars:
    def __init__(self) -> None:
        self.posted: list[tuple[str, dict[str, Any]]] = []

    def get(self, pod: Any, path: str) -> dict[str, Any] | None:
        return {"state": "running"}

    def post(self, pod: Any, path: str, body: Any) -> dict[str, Any] | None:
        self.posted.append((path, dict(body)))
        return {"state": "running"}


def workspace_pod(**annotations: str) -> dict[str, Any]:
    return {"metadata": {"name": "ws-nb", "namespace": "stasis-ml-a",
                         "labels": {MANAGED_BY: STASIS},
                         "annotations": {ANN_WORKSPACE_ID: WS, ANN_REQUESTID: "r1",
                                         **annotations}},
            "status": {"conditions": [{"type": "Ready", "status": "True"}]}}


def snapshot_request(prefix: str = PREFIX, base: str | None = BASE) -> str:
    return json.dumps({"snapshot_id": prefix.rpartition("/")[2], "bucket": BUCKET,
                       "prefix": prefix, "requestid": "r1", "requested_at_ms": 1,
                       "base": {"snapshot_id": "v2", "prefix": base,
                                "manifest_sha256": "ab" * 32} if base else None})


def test_the_monitors_snapshot_request_carries_the_downscoped_credential() -> None:
    sts, sidecars = STS(), Sidecars()
    monitor = Monitor(Cluster([workspace_pod(**{ANN_SNAPSHOT_REQUEST: snapshot_request()})]),
                      RecordingPublisher(), sidecars,
                      tokens=DownscopedTokens(SourceCredentials(), sts))
    monitor.sync()
    [(path, body)] = sidecars.posted
    assert path == "/snapshots"
    assert body["credential"]["token"] == "downscoped-1"
    [rule] = sts.boundary()["accessBoundary"]["accessBoundaryRules"]
    assert rule["availablePermissions"] == ["inRole:roles/storage.objectAdmin"]
    assert rule["availabilityCondition"]["expression"] == \
        snapshot_access.boundary(BUCKET, WS, PREFIX, "snapshot")[0].expression


def test_the_monitors_restore_request_carries_a_read_only_credential() -> None:
    sts, sidecars = STS(), Sidecars()
    restore = json.dumps({"snapshot_id": "v3", "bucket": BUCKET, "prefix": PREFIX,
                          "requestid": "r1", "manifest_sha256": "ab" * 32})
    pod = workspace_pod(**{ANN_OPERATION: "restore", ANN_RESTORE_REQUEST: restore})
    Monitor(Cluster([pod]), RecordingPublisher(), sidecars,
            tokens=DownscopedTokens(SourceCredentials(), sts)).sync()
    [(path, body)] = sidecars.posted
    assert path == "/restore" and body["credential"]["token"] == "downscoped-1"
    [rule] = sts.boundary()["accessBoundary"]["accessBoundaryRules"]
    assert rule["availablePermissions"] == ["inRole:roles/storage.objectViewer"]


def test_a_request_for_another_workspaces_folder_gets_no_token() -> None:
    """A snapshot request naming a teammate's folder (or basing itself on a teammate's
    snapshot) fails without a token minted or the agent asked."""
    for request in (snapshot_request(prefix="snapshots/ml-a/ml-a--other/s9"),
                    snapshot_request(base="snapshots/ml-a/ml-a--other/s0")):
        sts, sidecars, bus = STS(), Sidecars(), RecordingPublisher()
        Monitor(Cluster([workspace_pod(**{ANN_SNAPSHOT_REQUEST: request})]), bus, sidecars,
                tokens=DownscopedTokens(SourceCredentials(), sts)).sync()
        assert sts.calls == [] and sidecars.posted == []
        [finished] = [e for e in bus.events if e.name == "snapshot.finished"]
        assert not finished.payload.succeeded
        assert "ml-a--other" in finished.payload.error


def test_a_restore_of_another_workspaces_folder_is_refused() -> None:
    sts, sidecars, bus = STS(), Sidecars(), RecordingPublisher()
    restore = json.dumps({"snapshot_id": "s9", "bucket": BUCKET,
                          "prefix": "snapshots/ml-a/ml-a--other/s9", "requestid": "r1",
                          "manifest_sha256": "ab" * 32})
    pod = workspace_pod(**{ANN_OPERATION: "restore", ANN_RESTORE_REQUEST: restore})
    Monitor(Cluster([pod]), bus, sidecars,
            tokens=DownscopedTokens(SourceCredentials(), sts)).sync()
    assert sts.calls == [] and sidecars.posted == []
    assert bus.names() == ["workspace.runtime_failed"]
    assert bus.events[0].payload.cause == "restore_refused"
    assert "ml-a--other" in bus.events[0].payload.reason


# -- the sidecar uses only it ------------------------------------------------------------------


TOKEN = sidecar_token("deployment-key", WS)


def sidecar(*, require: bool) -> tuple[Any, list[dict[str, Any]]]:
    calls: list[dict[str, Any]] = []
    done = threading.Event()

    def take(client: Any, runtime_dir: Path, **kwargs: Any) -> Any:
        calls.append(kwargs)
        done.set()
        return SimpleNamespace(uri="gs://x/y", bytes=1, duration_ms=1, captured=[], skipped=[],
                               kernels=0, manifest_sha256="ab" * 32, parts={},
                               uploaded_bytes=0)

    def restore(client: Any, runtime_dir: Path, **kwargs: Any) -> Any:
        calls.append(kwargs)
        done.set()
        return SimpleNamespace(kernels_restored=0, sessions_restored=0)

    class Jupyter:
        def __enter__(self) -> Jupyter:
            return self

        def __exit__(self, *exc: object) -> None:
            pass

    agent = Agent(workspace_id=WS, client=Jupyter, runtime_dir=Path("/run/jupyter"),
                  take=take, restore=restore, require_credential=require)
    client = create_app(agent, TOKEN).test_client()
    client.environ_base["HTTP_X_STASIS_SIDECAR_TOKEN"] = TOKEN
    client.done = done  # type: ignore[attr-defined]
    return client, calls


def test_against_cloud_storage_the_sidecar_refuses_a_request_without_a_credential() -> None:
    client, calls = sidecar(require=True)
    for path in ("/snapshots", "/restore"):
        for credential in (None, {}, {"token": ""}, "downscoped"):
            body: dict[str, Any] = {"snapshot_id": "v3", "bucket": BUCKET, "prefix": PREFIX,
                                    "manifest_sha256": "ab" * 32}
            if credential is not None:
                body["credential"] = credential
            answer = client.post(path, json=body)
            assert answer.status_code == 403, (path, credential)
            assert "credential" in answer.get_json()["error"]
    assert calls == []
    assert client.get("/restore").get_json() == {"state": "none"}


def test_the_sidecar_hands_the_token_to_the_snapshot_and_the_restore() -> None:
    for path in ("/snapshots", "/restore"):
        client, calls = sidecar(require=True)
        answer = client.post(path, json={
            "snapshot_id": "v3", "bucket": BUCKET, "prefix": PREFIX,
            "manifest_sha256": "ab" * 32,
            "credential": {"token": "downscoped-1", "expiry": "2026-01-01T00:00:00+00:00"}})
        assert answer.status_code == 202
        assert client.done.wait(5)
        assert calls[0]["access_token"] == "downscoped-1"


def test_on_the_emulator_a_request_without_a_credential_runs_as_before() -> None:
    client, calls = sidecar(require=False)
    assert client.post("/snapshots", json={"snapshot_id": "v3", "bucket": BUCKET,
                                           "prefix": PREFIX}).status_code == 202
    assert client.done.wait(5)
    assert calls[0]["access_token"] is None


def test_the_sidecar_requires_a_credential_unless_it_talks_to_the_emulator(
        monkeypatch: pytest.MonkeyPatch) -> None:
    from runtime.kubernetes.sidecar import agent_from_environment

    monkeypatch.delenv("STORAGE_EMULATOR_HOST", raising=False)
    assert agent_from_environment().require_credential is True
    monkeypatch.setenv("STORAGE_EMULATOR_HOST", "http://127.0.0.1:4443")
    assert agent_from_environment().require_credential is False


# -- the store and the kernel use only it -----------------------------------------------------


def test_a_store_with_a_token_sends_it_and_never_asks_for_default_credentials(
        monkeypatch: pytest.MonkeyPatch) -> None:
    import google.auth

    from runtime.snapshot.storage import ObjectStore, get_store

    def no_default(*args: Any, **kwargs: Any) -> Any:
        raise AssertionError("the pod's own credentials were asked for")

    monkeypatch.setattr(google.auth, "default", no_default)
    monkeypatch.delenv("STORAGE_EMULATOR_HOST", raising=False)
    store = ObjectStore(access_token="downscoped-1")
    assert store._auth_headers() == {"Authorization": "Bearer downscoped-1"}
    assert store.client._credentials.token == "downscoped-1"
    assert get_store(access_token="downscoped-1") is get_store(access_token="downscoped-1")
    assert get_store(access_token="downscoped-1").access_token == "downscoped-1"
    assert get_store(access_token="downscoped-2") is not get_store(access_token="downscoped-1")


def test_the_sidecars_engine_passes_the_token_to_the_kernel_and_the_manifest(
        monkeypatch: pytest.MonkeyPatch) -> None:
    from runtime.local.snapshots import default_engine
    from runtime.snapshot import kernels

    sent: list[dict[str, Any]] = []
    monkeypatch.setattr(kernels, "_call", lambda conn, op, args, **kw: sent.append(
        {"op": op, **args}) or {})
    engine = default_engine("downscoped-1")
    engine.snapshot_kernel("/run/jupyter/kernel-k1.json", bucket=BUCKET, prefix=PREFIX,
                           kernel_id="k1", timeout=5.0)
    assert sent[0]["op"] == "capture" and sent[0]["access_token"] == "downscoped-1"
    bound = engine.read_manifest.keywords["store"]  # type: ignore[attr-defined]
    assert bound.access_token == "downscoped-1"
    sent.clear()
    default_engine().snapshot_kernel("/run/jupyter/kernel-k1.json", bucket=BUCKET,
                                     prefix=PREFIX, kernel_id="k1", timeout=5.0)
    assert "access_token" not in sent[0]


def test_in_the_kernel_the_capture_and_the_restore_use_the_token(
        monkeypatch: pytest.MonkeyPatch) -> None:
    from runtime.snapshot import inkernel

    asked: list[dict[str, Any]] = []

    class Stop(Exception):
        pass

    def get_store(emulator_host: str | None = None, **kwargs: Any) -> Any:
        asked.append(kwargs)
        raise Stop

    monkeypatch.setattr(inkernel, "get_store", get_store)
    with pytest.raises(Stop):
        inkernel.capture({"x": 1}, bucket=BUCKET, prefix=PREFIX, kernel_id="k1",
                         access_token="downscoped-1")
    entry = {"format": layout.FORMAT, "kernel_id": "k1", "segments": [1], "placements": [None],
             "objects": [{"name": f"{layout.pool_prefix(PREFIX)}/ab", "offset": 0, "bytes": 1,
                          "sha256": "ab" * 32}], "python": inkernel._python()}
    with pytest.raises(Stop):
        inkernel.restore({}, entry, bucket=BUCKET, access_token="downscoped-1")
    assert asked == [{"access_token": "downscoped-1"}] * 2
