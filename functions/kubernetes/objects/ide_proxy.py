"""The IDE access proxy's objects (``functions.ideproxy``): in the system namespace, behind
IAP through GKE's Gateway API, applied once per cluster by an admin or Terraform.

The Gateway (``gke-l7-global-external-managed``) is GKE's global external Application Load
Balancer on a reserved address with a Google-managed certificate (a pre-shared one); its
GCPBackendPolicy turns IAP on and keeps WebSockets open a day (the backend timeout is a
WebSocket's longest life there); its HealthCheckPolicy checks ``/healthz``, which needs no
identity. The Gateway API and GKE fields are those of the CRDs transcribed in
``tests/data/crds/gateway.networking.k8s.io.json`` and ``networking.gke.io.json``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from functions.kubernetes.objects.meta import (
    APP_NAME,
    GKE_SERVICE_ACCOUNT,
    MANAGED_BY,
    STASIS,
    meta,
)
from functions.kubernetes.objects.rbac import RBAC_API, rule
from functions.kubernetes.objects.security import restricted_container, restricted_pod
from functions.kubernetes.objects.settings import ClusterSettings

IDE_PROXY = "stasis-ide-proxy"
IDE_PROXY_PORT = 8718
#: What the proxy's pods are labelled with: each workspace admits them to its IDE port.
IDE_PROXY_LABELS = {APP_NAME: IDE_PROXY}

GATEWAY_API = "gateway.networking.k8s.io"
GKE_NETWORKING_API = "networking.gke.io"
#: GKE's global external Application Load Balancer (one IP, a Google-managed certificate).
GATEWAY_CLASS = "gke-l7-global-external-managed"
#: The load balancer ends a WebSocket at its backend timeout: an IDE tab stays connected a
#: day (then reconnects, authorized again).
WEBSOCKET_SECONDS = 86400
IAP_SECRET_KEY = "key"


@dataclass(frozen=True)
class IdeProxyDeployment:
    """What a deployment decides about the IDE proxy (Terraform fills these in).

    ``address``: the name of a reserved global IP; ``certificate``: the name of a
    Google-managed SSL certificate for ``host`` (a pre-shared certificate of the Gateway);
    ``oauth_client_id`` and the Secret ``oauth_secret`` (key ``key``): IAP's OAuth client;
    ``iap_audience``: ``/projects/<number>/global/backendServices/<id>`` of the backend the
    Gateway creates (known once it exists; empty, the proxy refuses every request).
    """

    project: str
    host: str
    address: str
    certificate: str
    oauth_client_id: str
    iap_audience: str
    image: str | None = None
    gcp_service_account: str | None = None
    oauth_secret: str = "stasis-ide-iap"
    email_domain: str | None = None
    replicas: int = 2


def ide_proxy_manifests(deployment: IdeProxyDeployment,
                        settings: ClusterSettings = ClusterSettings()) -> list[dict[str, Any]]:
    """The IDE access proxy (``functions.ideproxy``) in the system namespace, behind IAP:
    ServiceAccount (Workload Identity: reads Firestore, publishes resumes), a ClusterRole
    to read workspace Pods and their token Secrets (``Runtime.status``: where the IDE is),
    its binding, the Deployment, its Service, and GKE's Gateway API objects: a Gateway (the
    global load balancer on the reserved IP with the managed certificate), an HTTPRoute for
    ``host``, a GCPBackendPolicy (IAP on, WebSockets kept a day) and a HealthCheckPolicy
    (``/healthz``, which needs no identity). Each workspace's NetworkPolicy admits these
    pods alone to its IDE port (``workspace.network_policy``)."""
    ns, d = settings.system_namespace, deployment
    labels = dict(IDE_PROXY_LABELS)
    sa_annotations = ({GKE_SERVICE_ACCOUNT: d.gcp_service_account}
                      if d.gcp_service_account else None)
    account = {"apiVersion": "v1", "kind": "ServiceAccount",
               "metadata": meta(IDE_PROXY, ns, labels=labels, annotations=sa_annotations)}
    role = {"apiVersion": f"{RBAC_API}/v1", "kind": "ClusterRole",
            "metadata": meta(IDE_PROXY, labels=labels),
            # get only: the names come from the workspace id (workspace_names)
            "rules": [rule("", ["pods", "secrets"], ["get"])]}
    binding = {"apiVersion": f"{RBAC_API}/v1", "kind": "ClusterRoleBinding",
               "metadata": meta(IDE_PROXY, labels=labels),
               "roleRef": {"apiGroup": RBAC_API, "kind": "ClusterRole", "name": IDE_PROXY},
               "subjects": [{"kind": "ServiceAccount", "name": IDE_PROXY, "namespace": ns}]}
    env = [{"name": "STASIS_PROJECT", "value": d.project},
           {"name": "GOOGLE_CLOUD_PROJECT", "value": d.project},
           {"name": "STASIS_RUNTIME", "value": "kubernetes"},
           {"name": "STASIS_K8S_SYSTEM_NAMESPACE", "value": ns},
           {"name": "STASIS_IAP_AUDIENCE", "value": d.iap_audience},
           {"name": "STASIS_DASHBOARD_EMAIL_DOMAIN", "value": d.email_domain or ""},
           {"name": "PYTHONPATH", "value": settings.agent_source_root}]
    probe = {"httpGet": {"path": "/healthz", "port": "http"}, "periodSeconds": 5}
    deployment_obj = {
        "apiVersion": "apps/v1", "kind": "Deployment",
        "metadata": meta(IDE_PROXY, ns, labels=labels),
        "spec": {
            "replicas": d.replicas,
            "selector": {"matchLabels": labels},
            "template": {
                "metadata": {"labels": {**labels, MANAGED_BY: STASIS}},
                "spec": {
                    "serviceAccountName": IDE_PROXY,
                    "securityContext": restricted_pod(settings.uid, settings.gid),
                    "containers": [{
                        "name": "ide-proxy", "image": d.image or settings.agent_image,
                        "command": ["python", "-m", "functions.ideproxy", "--host", "0.0.0.0",
                                    "--port", str(IDE_PROXY_PORT)],
                        "env": env,
                        "ports": [{"name": "http", "containerPort": IDE_PROXY_PORT,
                                   "protocol": "TCP"}],
                        "readinessProbe": probe, "livenessProbe": probe,
                        "resources": {"requests": {"cpu": "250m", "memory": "256Mi"},
                                      "limits": {"cpu": "1", "memory": "512Mi"}},
                        "securityContext": restricted_container(read_only_root=True),
                    }],
                },
            },
        },
    }
    service = {"apiVersion": "v1", "kind": "Service",
               "metadata": meta(IDE_PROXY, ns, labels=labels),
               "spec": {"type": "ClusterIP", "selector": labels,
                        "ports": [{"name": "http", "port": 80, "targetPort": "http",
                                   "protocol": "TCP"}]}}
    target = {"group": "", "kind": "Service", "name": IDE_PROXY}
    gateway = {"apiVersion": f"{GATEWAY_API}/v1", "kind": "Gateway",
               "metadata": meta(IDE_PROXY, ns, labels=labels),
               "spec": {"gatewayClassName": GATEWAY_CLASS,
                        "addresses": [{"type": "NamedAddress", "value": d.address}],
                        "listeners": [{
                            "name": "https", "protocol": "HTTPS", "port": 443,
                            "hostname": d.host,
                            "tls": {"mode": "Terminate", "options": {
                                "networking.gke.io/pre-shared-certs": d.certificate}},
                            "allowedRoutes": {"namespaces": {"from": "Same"}}}]}}
    route = {"apiVersion": f"{GATEWAY_API}/v1", "kind": "HTTPRoute",
             "metadata": meta(IDE_PROXY, ns, labels=labels),
             "spec": {"parentRefs": [{"name": IDE_PROXY, "sectionName": "https"}],
                      "hostnames": [d.host],
                      "rules": [{"backendRefs": [{"name": IDE_PROXY, "port": 80}]}]}}
    backend = {"apiVersion": f"{GKE_NETWORKING_API}/v1", "kind": "GCPBackendPolicy",
               "metadata": meta(IDE_PROXY, ns, labels=labels),
               "spec": {"targetRef": target,
                        "default": {"timeoutSec": WEBSOCKET_SECONDS,
                                    "logging": {"enabled": True},
                                    "iap": {"enabled": True, "clientID": d.oauth_client_id,
                                            "oauth2ClientSecret": {"name": d.oauth_secret}}}}}
    health = {"apiVersion": f"{GKE_NETWORKING_API}/v1", "kind": "HealthCheckPolicy",
              "metadata": meta(IDE_PROXY, ns, labels=labels),
              "spec": {"targetRef": target,
                       "default": {"config": {"type": "HTTP", "httpHealthCheck": {
                           "requestPath": "/healthz", "port": IDE_PROXY_PORT}}}}}
    return [account, role, binding, deployment_obj, service, gateway, route, backend, health]
