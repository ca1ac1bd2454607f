"""Builds the proxy and the link issuer from the control plane's ``Deps`` (``bootstrap`` calls
this lazily, once per instance): the Firestore link store on the same client, the Jupyter
kernel gateway over the runtime's ``status``, the identity, and (where sandboxes run) the
sandbox reads of ``stasis/sandboxes``; and the ``proxy`` and ``links`` functions' handlers
(``functions/routes.py``), which are given that :class:`Wiring`.

Environment:

- ``STASIS_IAP_AUDIENCE`` (or ``STASIS_IDENTITY=iap``): verify ``x-goog-iap-jwt-assertion``
  for that audience; ``STASIS_IDENTITY=dev`` or the local stack (Firestore emulator): the
  explicit dev identity (``X-Stasis-User``); neither: every request is refused. A
  deployment never falls back to trusting a header.
- ``STASIS_PROXY_URL``: the proxy's public base URL written into links (default: this
  host's ``/proxy``).
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from werkzeug.wrappers import Request

from functions.proxy.access import AccessProxy
from functions.proxy.issuer import LinkIssuer
from functions.proxy.ports import Caller, Identity, Unauthenticated


@dataclass(frozen=True)
class Wiring:
    proxy: AccessProxy
    issuer: LinkIssuer


class _Misconfigured:
    def __init__(self, why: str) -> None:
        self.why = why

    def caller(self, headers: Mapping[str, str]) -> Caller:
        raise Unauthenticated(self.why)


def identity_from_env(environ: Mapping[str, str] = os.environ) -> Identity:
    """The same rule as the dashboard's (``functions/dashboard/access.py``), failing closed:
    an IAP audience (or ``STASIS_IDENTITY=iap``) means IAP; ``STASIS_IDENTITY=dev`` or the
    local stack (the Firestore emulator configured) the dev identity; anything else refuses
    every request with a message naming the variable to set."""
    from functions.adapters.iap import IAP_CERTS_URL, DevIdentity, IapIdentity

    chosen = environ.get("STASIS_IDENTITY", "").strip().lower()
    audience = environ.get("STASIS_IAP_AUDIENCE", "").strip()
    if audience or chosen == "iap":
        if not audience:
            return _Misconfigured("the proxy is not configured: STASIS_IAP_AUDIENCE is unset")
        return IapIdentity(audience,
                           certs_url=environ.get("STASIS_IAP_CERTS_URL") or IAP_CERTS_URL)
    if chosen == "dev" or (not chosen and environ.get("FIRESTORE_EMULATOR_HOST")):
        return DevIdentity()
    return _Misconfigured("the proxy has no identity source: set STASIS_IAP_AUDIENCE behind "
                          "Identity-Aware Proxy, or STASIS_IDENTITY=dev on a local stack")


def proxy_url(request: Request) -> str:
    configured = os.environ.get("STASIS_PROXY_URL")
    return configured.rstrip("/") if configured else request.host_url.rstrip("/") + "/proxy"


def build(deps: Any) -> Wiring:
    from functions.adapters.jupyter_kernel import JupyterGateway
    from functions.adapters.link_store import FirestoreLinkStore
    from functions.adapters.sandbox_results import FirestoreSandboxResults
    from functions.adapters.snapshots import storage_client

    store = FirestoreLinkStore(deps.store.db)
    identity = identity_from_env()
    issuer = LinkIssuer(store, deps.bus, identity, clock=deps.clock, proxy_url=proxy_url)
    sandboxes = None
    if deps.sandboxes is not None:
        project = os.environ.get("STASIS_PROJECT") or os.environ.get(
            "GOOGLE_CLOUD_PROJECT") or "stasis-local"
        sandboxes = FirestoreSandboxResults(deps.store.db, lambda: storage_client(project))
    proxy = AccessProxy(store, JupyterGateway(deps.runtime.status), deps.bus, identity,
                        clock=deps.clock, on_exposed=issuer.revoke_exposed,
                        sandboxes=sandboxes)
    issuer.revoked_listeners.append(proxy.auth.forget)
    return Wiring(proxy, issuer)


def serve_proxy(request: Request, wiring: Wiring) -> Any:
    """The ``proxy`` function: the access proxy for agent links (``access.py``)."""
    return wiring.proxy(request)


def serve_links(request: Request, wiring: Wiring) -> Any:
    """The ``links`` function: create, list and revoke agent links (``issuer.py``)."""
    return wiring.issuer(request)
