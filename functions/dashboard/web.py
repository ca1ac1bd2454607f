"""The dashboard's HTTP edge: identity, admin check, routing, rendering.

``handle(request, deps)`` takes the Flask request functions-framework passes and returns
``(html, status, headers)``. Pages live under the function's root (``/dashboard/`` on the
local function host, the service's root behind IAP): ``/`` and ``/fleet``, ``/snapshots``,
``/cost``, ``/latency``, ``/links``, ``/sandboxes``, ``/audit``. Links are built from the
request's script root, so the same code works mounted anywhere.

The page sets a Content-Security-Policy that allows no script and only its own stylesheet
(by hash): the dashboard has no JavaScript, and a value that slipped past escaping could
not run any either.
"""

from __future__ import annotations

import base64
import hashlib
import os
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any, Protocol
from urllib.parse import urlencode

import jinja2

from functions.dashboard import access, pages
from functions.dashboard.reads import CursorGone, Reader

TEMPLATES = Path(__file__).resolve().parent / "templates"
STYLESHEET = (TEMPLATES / "dashboard.css").read_text()
_STYLE_HASH = base64.b64encode(hashlib.sha256(STYLESHEET.encode()).digest()).decode()
CSP = ("default-src 'none'; "
       f"style-src 'sha256-{_STYLE_HASH}'; "
       "img-src data:; form-action 'self'; base-uri 'none'; frame-ancestors 'none'")
NAV = (("fleet", "Fleet"), ("snapshots", "Snapshots"), ("cost", "Cost"),
       ("latency", "Latency"), ("links", "Links"), ("sandboxes", "Sandboxes"),
       ("audit", "Audit log"))

_env = jinja2.Environment(loader=jinja2.FileSystemLoader(TEMPLATES),
                          autoescape=jinja2.select_autoescape(["html"]),
                          undefined=jinja2.StrictUndefined, trim_blocks=True,
                          lstrip_blocks=True)


class Identity(Protocol):
    def caller(self, headers: Mapping[str, str]) -> Any:
        """An object with ``.user``; raises on a missing or bad assertion."""


@dataclass(frozen=True)
class WebDeps:
    #: A fresh reader per request (it counts what the request read).
    reader: Callable[[], Reader]
    clock: Callable[[], datetime]
    #: The IAP verifier for (audience, certs URL); called only in IAP mode.
    iap: Callable[[str, str], Identity]
    environ: Callable[[], Mapping[str, str]] = field(default=lambda: os.environ)


def handle(request: Any, deps: WebDeps) -> tuple[str, int, dict[str, str]]:
    started = time.monotonic()
    base = (request.script_root or "").rstrip("/")

    def url(target: str, /, **params: str | None) -> str:
        kept = {k: v for k, v in params.items() if v}
        return f"{base}/{target}" + ("?" + urlencode(kept) if kept else "")

    if request.method not in ("GET", "HEAD"):
        return _error(url, 405, "Read-only", "the dashboard only reads: use GET", None,
                      extra={"Allow": "GET, HEAD"})
    config = access.access_config(deps.environ())
    if config.mode == access.Mode.UNCONFIGURED:
        return _error(url, 403, "Not configured", access.UNCONFIGURED_MESSAGE, None)
    email: str | None = None
    if config.mode == access.Mode.IAP:
        assert config.audience is not None
        try:
            caller = deps.iap(config.audience, config.certs_url).caller(dict(request.headers))
        except Exception as exc:  # the verifier's own error types; all mean "no identity"
            return _error(url, 401, "Not signed in", f"{exc}: sign in through the "
                          "Identity-Aware Proxy", None)
        email = str(caller.user)
        user = access.user_for_email(email, config.email_domain)
    else:
        user = config.dev_user
    reader = deps.reader()
    catalog = reader.document("catalog", "current") or {}
    verdict = access.decide(user, email=email, config=config, catalog=catalog)
    identity = {"user": user, "mode": str(config.mode), "why": verdict.why}
    if not verdict.allowed:
        return _error(url, 403, "Admins only", verdict.why, identity)
    name = (request.path or "/").strip("/") or "fleet"
    if name not in pages.PAGES:
        return _error(url, 404, "No such page",
                      f"there is no page {name!r}: see the menu above", identity)
    params = {k: request.args.get(k, "") for k in request.args}
    ctx = pages.Context(reader=reader, catalog=catalog, now=deps.clock(), url=url,
                        visible=verdict.teams)
    try:
        data = pages.PAGES[name](ctx, params)
    except pages.NotYours as exc:
        return _error(url, 403, "Not your team", str(exc), identity)
    except pages.BadRequest as exc:
        return _error(url, 400, "Bad request", str(exc), identity)
    except CursorGone:
        return _error(url, 400, "The page moved", "the document this page started after is "
                      "gone: start again from the first page", identity)
    stats = reader.stats
    elapsed_ms = (time.monotonic() - started) * 1000
    html = _env.get_template(f"{name}.html").render(
        **data, page=name, nav=NAV, url=url, identity=identity, stylesheet=STYLESHEET,
        now=ctx.now, reads=stats, elapsed_ms=elapsed_ms,
        project=deps.environ().get("STASIS_PROJECT") or deps.environ().get(
            "GOOGLE_CLOUD_PROJECT", ""))
    headers = _headers()
    headers["X-Stasis-Reads"] = (f"documents={stats.documents}; queries={stats.queries}; "
                                 f"aggregations={stats.aggregations}")
    return html, 200, headers


def _headers() -> dict[str, str]:
    return {"Content-Type": "text/html; charset=utf-8", "Cache-Control": "no-store",
            "Content-Security-Policy": CSP, "X-Content-Type-Options": "nosniff",
            "Referrer-Policy": "no-referrer", "X-Frame-Options": "DENY"}


def _error(url: Callable[..., str], status: int, title: str, message: str,
           identity: Mapping[str, str] | None,
           extra: Mapping[str, str] | None = None) -> tuple[str, int, dict[str, str]]:
    html = _env.get_template("error.html").render(
        title=title, status=status, message=message, identity=identity, nav=NAV, url=url,
        page="", stylesheet=STYLESHEET, reads=None, now=None, elapsed_ms=None, project="")
    return html, status, {**_headers(), **(extra or {})}
