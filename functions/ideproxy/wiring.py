"""Builds the IDE proxy from the environment (``python -m functions.ideproxy`` calls it).

Environment:

- identity, failing closed: ``STASIS_IAP_AUDIENCE`` (a deployment behind IAP; optional
  ``STASIS_IAP_CERTS_URL``, and ``STASIS_DASHBOARD_EMAIL_DOMAIN`` to map e-mails to users
  as the dashboard does); else ``STASIS_SESSION_SECRET``, the portal's cookie secret (the
  local stack); neither: every request is refused with a message naming both;
- ``STASIS_PORTAL_URL``: where a browser without a session is sent to sign in;
- the control plane's own: the project and emulator hosts, ``STASIS_RUNTIME`` and its
  settings (``STASIS_NODE_AGENT_URL``, ``STASIS_K8S_*``): the runtime says where each
  workspace's IDE server is.
"""

from __future__ import annotations

import os
from collections.abc import Mapping

from aiohttp import web

from functions.ideproxy.access import Gate, IapVisitors, Identify, Refusing, SessionCookies
from functions.ideproxy.app import IdeProxy, make_app


def identify_from_env(environ: Mapping[str, str] = os.environ) -> Identify:
    audience = environ.get("STASIS_IAP_AUDIENCE", "").strip()
    if audience:
        from functions.adapters.iap import IAP_CERTS_URL, IapIdentity

        domain = environ.get("STASIS_DASHBOARD_EMAIL_DOMAIN", "").strip().lstrip("@") or None
        return IapVisitors(IapIdentity(audience, certs_url=environ.get(
            "STASIS_IAP_CERTS_URL") or IAP_CERTS_URL), domain)
    secret = environ.get("STASIS_SESSION_SECRET", "")
    if secret:
        return SessionCookies(secret.encode())
    return Refusing("the IDE proxy has no identity source: set STASIS_IAP_AUDIENCE behind "
                    "Identity-Aware Proxy, or STASIS_SESSION_SECRET (the portal's) locally")


def build(environ: Mapping[str, str] = os.environ) -> web.Application:
    from functions import bootstrap
    from functions.adapters.link_store import FirestoreLinkStore
    from functions.adapters.pubsub_bus import PubSubBus
    from functions.domain.publishers import IDE_PROXY

    project = bootstrap.project()
    bus = PubSubBus(project, origin=IDE_PROXY)
    runtime = bootstrap.runtime_for(bus)
    proxy = IdeProxy(Gate(FirestoreLinkStore(bootstrap.database())),
                     identify_from_env(environ), runtime.status, bus,
                     portal_url=environ.get("STASIS_PORTAL_URL") or None,
                     session_secret=environ.get("STASIS_SESSION_SECRET", "").encode())
    return make_app(proxy)
