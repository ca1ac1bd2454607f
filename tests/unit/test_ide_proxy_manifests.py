"""The IDE access proxy on GKE: its objects (validated against the Kubernetes OpenAPI schema
and the transcribed Gateway API and GKE CRDs), and what the workspace objects do for it
(base paths, the URL the proxy reaches, the NetworkPolicy that admits the proxy alone)."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import jsonschema
import kubernetes_validate
import pytest
from crd_schemas import load, strict

from functions.kubernetes.objects import ide_proxy as proxy
from functions.kubernetes.objects import workspace as w
from functions.kubernetes.objects.hardware import Hardware
from functions.kubernetes.objects.meta import ANN_IDE_KIND, annotations_of
from functions.kubernetes.objects.settings import ClusterSettings

K8S_VERSION = "1.35"
CRDS = {group: load(group) for group in ("gateway.networking.k8s.io", "networking.gke.io")}
DEPLOYMENT = proxy.IdeProxyDeployment(
    project="example-project", host="ide.example.com", address="stasis-ide",
    certificate="stasis-ide-cert", oauth_client_id="1234.apps.googleusercontent.com",
    iap_audience="/projects/42/global/backendServices/77", image="r/stasis/agent:1",
    gcp_service_account="ide@example-project.iam.gserviceaccount.com",
    email_domain="example.com")
OBJECTS = proxy.ide_proxy_manifests(DEPLOYMENT)


def _shape(ide_kind: str = "jupyterlab") -> w.WorkspaceShape:
    return w.WorkspaceShape(workspace_id="ml-a--nb", team="ml-a", owner="bob",
                            profile="cpu-small", ide=ide_kind, ide_kind=ide_kind,
                            image="r/python:3.11", hardware=Hardware(1000, "2Gi"),
                            method="kernel", home_size="10Gi", storage_class="standard-rwo")


def _validate(obj: dict[str, Any]) -> None:
    group = obj["apiVersion"].split("/")[0]
    if group in CRDS:
        schema = CRDS[group]["kinds"][obj["kind"]]["openAPIV3Schema"]
        jsonschema.validate(obj, strict(schema, any_metadata=True),
                            format_checker=jsonschema.FormatChecker())
    else:
        kubernetes_validate.validate(obj, K8S_VERSION, strict=True)


@pytest.mark.parametrize("obj", OBJECTS, ids=[o["kind"] for o in OBJECTS])
def test_every_object_is_valid(obj: dict[str, Any]) -> None:
    _validate(obj)


def test_the_crd_validation_is_strict() -> None:
    policy = next(o for o in OBJECTS if o["kind"] == "GCPBackendPolicy")
    typo = {**policy, "spec": {**policy["spec"], "default": {"timeoutSecs": 1}}}
    with pytest.raises(jsonschema.ValidationError):
        _validate(typo)
    route = next(o for o in OBJECTS if o["kind"] == "HTTPRoute")
    with pytest.raises(jsonschema.ValidationError):
        _validate({**route, "spec": {**route["spec"], "hostnames": ["Not A Host"]}})


def test_the_proxy_is_behind_iap_on_its_host_and_keeps_websockets_open() -> None:
    kinds = {o["kind"]: o for o in OBJECTS}
    assert set(kinds) == {"ServiceAccount", "ClusterRole", "ClusterRoleBinding", "Deployment",
                          "Service", "Gateway", "HTTPRoute", "GCPBackendPolicy",
                          "HealthCheckPolicy"}
    assert {o["metadata"].get("namespace") for o in OBJECTS} == {"stasis-system", None}
    gateway = kinds["Gateway"]["spec"]
    assert gateway["gatewayClassName"] == "gke-l7-global-external-managed"
    assert gateway["addresses"] == [{"type": "NamedAddress", "value": "stasis-ide"}]
    [listener] = gateway["listeners"]
    assert (listener["protocol"], listener["port"], listener["hostname"]) == \
        ("HTTPS", 443, "ide.example.com")
    assert listener["tls"]["options"] == {"networking.gke.io/pre-shared-certs":
                                          "stasis-ide-cert"}
    assert kinds["HTTPRoute"]["spec"]["hostnames"] == ["ide.example.com"]
    policy = kinds["GCPBackendPolicy"]["spec"]
    assert policy["targetRef"] == {"group": "", "kind": "Service", "name": "stasis-ide-proxy"}
    assert policy["default"]["iap"] == {
        "enabled": True, "clientID": "1234.apps.googleusercontent.com",
        "oauth2ClientSecret": {"name": "stasis-ide-iap"}}
    assert policy["default"]["timeoutSec"] == 86400  # the load balancer's WebSocket limit
    check = kinds["HealthCheckPolicy"]["spec"]["default"]["config"]["httpHealthCheck"]
    assert check == {"requestPath": "/healthz", "port": proxy.IDE_PROXY_PORT}
    container = kinds["Deployment"]["spec"]["template"]["spec"]["containers"][0]
    assert container["command"] == ["python", "-m", "functions.ideproxy", "--host", "0.0.0.0",
                                    "--port", "8718"]
    env = {e["name"]: e["value"] for e in container["env"]}
    assert env["STASIS_IAP_AUDIENCE"] == "/projects/42/global/backendServices/77"
    assert env["STASIS_RUNTIME"] == "kubernetes" and env["STASIS_PROJECT"] == "example-project"
    assert "STASIS_SESSION_SECRET" not in env  # behind IAP: no cookie is trusted
    assert kinds["ServiceAccount"]["metadata"]["annotations"] == {
        "iam.gke.io/gcp-service-account": "ide@example-project.iam.gserviceaccount.com"}


def test_the_proxy_reads_workspace_pods_and_tokens_and_nothing_more() -> None:
    role = next(o for o in OBJECTS if o["kind"] == "ClusterRole")
    assert role["rules"] == [{"apiGroups": [""], "resources": ["pods", "secrets"],
                              "verbs": ["get"]}]


def test_a_workspace_admits_the_proxy_alone_to_its_ide_port() -> None:
    settings = ClusterSettings(function_cidrs=("10.10.0.0/20",))
    ide, agent = w.network_policy(_shape(), settings)["spec"]["ingress"]
    assert ide["from"] == [
        {"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "stasis-system"}},
         "podSelector": {"matchLabels": {"app.kubernetes.io/name": "stasis-ide-proxy"}}},
        {"ipBlock": {"cidr": "10.10.0.0/20"}}]  # and the links proxy's functions
    assert agent["from"][0]["podSelector"]["matchLabels"] == {
        "app.kubernetes.io/name": "stasis-monitor"}
    proxy_pods = next(o for o in OBJECTS if o["kind"] == "Deployment")["spec"]["template"]
    assert ide["from"][0]["podSelector"]["matchLabels"].items() <= \
        proxy_pods["metadata"]["labels"].items()


def test_the_workspaces_ide_serves_under_the_proxys_path() -> None:
    pod = w.workspace_pod(_shape(), requestid="r", requested_at_ms=1)
    lab = next(c for c in pod["spec"]["containers"] if c["name"] == w.WORKSPACE_CONTAINER)
    assert "--ServerApp.base_url=/w/ml-a--nb/" in lab["args"]
    assert lab["readinessProbe"]["httpGet"]["path"] == "/w/ml-a--nb/api"
    agent = next(c for c in pod["spec"]["containers"] if c["name"] != w.WORKSPACE_CONTAINER)
    assert {"name": "JUPYTER_URL", "value": "http://127.0.0.1:8888/w/ml-a--nb"} in agent["env"]
    assert annotations_of(pod)[ANN_IDE_KIND] == "jupyterlab"
    service = w.workspace_names("ml-a", "ml-a--nb").service
    assert w.url_of_pod(pod) == w.workspace_url(_shape()) == \
        f"http://{service}.stasis-ml-a.svc.cluster.local:8888/w/ml-a--nb/"
    code = w.workspace_pod(_shape("vscode"), requestid="r", requested_at_ms=1)
    server = next(c for c in code["spec"]["containers"] if c["name"] == w.WORKSPACE_CONTAINER)
    assert server["args"][server["args"].index("--abs-proxy-base-path") + 1] == "/w/ml-a--nb"
    assert w.url_of_pod(code).endswith(":8888/")  # code-server serves at its root
    older = replace_annotations(pod, {ANN_IDE_KIND: None})
    assert w.url_of_pod(older).endswith(":8888/")  # a pod from before base paths


def replace_annotations(pod: dict[str, Any], changes: dict[str, str | None]) -> dict[str, Any]:
    annotations = {k: v for k, v in {**annotations_of(pod), **changes}.items()
                   if v is not None}
    return {**pod, "metadata": {**pod["metadata"], "annotations": annotations}}


def test_every_default_is_valid_too() -> None:
    minimal = proxy.IdeProxyDeployment(project="p", host="ide.example.com", address="a",
                                   certificate="c", oauth_client_id="id", iap_audience="")
    for obj in proxy.ide_proxy_manifests(minimal, replace(ClusterSettings(),
                                                      system_namespace="ops")):
        _validate(obj)
        assert obj["metadata"].get("namespace") in (None, "ops")
