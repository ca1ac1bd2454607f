"""The agent's side of a link: run code through the access proxy with nothing but the link.

``run(link_url, code)`` posts the code to ``<proxy>/<workspace>/execute`` with the token
from the link's fragment in ``Authorization: Bearer``, streams the NDJSON answer (stdout to
stdout, stderr and tracebacks to stderr, progress such as "resuming" to stderr) and returns
the exit status:

== ===========================================================================
0  the cell ran and succeeded
1  the cell raised
3  the link was refused (expired, revoked, wrong scope, ...) or revoked mid-run
4  the workspace could not run it (unavailable, resume refused or timed out,
   network error)
== ===========================================================================

Needs no stack settings, cloud credentials or SSH: the link says where and who. Behind IAP
(a deployment), the caller's IAP ID token goes in ``Proxy-Authorization`` (IAP accepts it
there, and ``Authorization`` carries the link): set ``STASIS_IAP_TOKEN``, e.g. from
``gcloud auth print-identity-token --audiences=<IAP client id>``.
"""

from __future__ import annotations

import json
import os
import re
import sys
from typing import IO, Any

import requests

from functions.domain.links import LinkAddress, parse_link_url

EXIT_OK, EXIT_CELL_ERROR, EXIT_REFUSED, EXIT_UNAVAILABLE = 0, 1, 3, 4
_ANSI = re.compile(r"\x1b\[[0-9;]*[A-Za-z]")
_REFUSED_ENDS = {"revoked", "expired", "denied"}


def auth_headers(address: LinkAddress, iap_token: str | None = None) -> dict[str, str]:
    headers = {"Authorization": f"Bearer {address.token}"}
    iap = iap_token if iap_token is not None else os.environ.get("STASIS_IAP_TOKEN")
    if iap:
        headers["Proxy-Authorization"] = f"Bearer {iap}"
    return headers


def run(link_url: str, code: str, *, notebook: str | None = None,
        kernel_id: str | None = None, timeout: float | None = None,
        out: IO[str] | None = None, err: IO[str] | None = None, verbose: bool = False,
        session: requests.Session | None = None) -> int:
    """Run ``code`` through the link, streaming its output; the exit status."""
    out = out or sys.stdout
    err = err or sys.stderr
    try:
        address = parse_link_url(link_url)
    except ValueError as exc:
        err.write(f"stasis: bad link: {exc}\n")
        return 2
    http = session or requests.Session()
    http.trust_env = False if _is_loopback(address) else http.trust_env
    body: dict[str, Any] = {"code": code}
    for key, value in (("notebook", notebook), ("kernel_id", kernel_id), ("timeout", timeout)):
        if value is not None:
            body[key] = value
    try:
        response = http.post(f"{address.workspace_url}/execute", json=body,
                             headers=auth_headers(address), stream=True, timeout=(10, None))
    except requests.RequestException as exc:
        err.write(f"stasis: cannot reach the proxy: {exc}\n")
        return EXIT_UNAVAILABLE
    with response:
        if response.status_code != 200:
            return _refused(response, err)
        return _stream(response, out, err, verbose)


def _stream(response: requests.Response, out: IO[str], err: IO[str], verbose: bool) -> int:
    tty = getattr(err, "isatty", lambda: False)()
    try:
        for raw in response.iter_lines(chunk_size=None):
            if not raw:
                continue
            message = json.loads(raw)
            kind = message.get("type")
            if kind == "stream":
                target = out if message.get("name") == "stdout" else err
                target.write(message.get("text", ""))
                target.flush()
            elif kind == "result":
                out.write(str(message.get("text", "")) + "\n")
                out.flush()
            elif kind == "error":
                trace = "\n".join(message.get("traceback") or [])
                trace = trace or f"{message.get('ename')}: {message.get('evalue')}"
                err.write((trace if tty else _ANSI.sub("", trace)) + "\n")
                err.flush()
            elif kind == "status":
                err.write(f"stasis: {message.get('message') or message.get('state')}\n")
                err.flush()
            elif kind == "kernel" and verbose:
                err.write(f"stasis: kernel {message.get('kernel_id')} "
                          f"({message.get('notebook') or 'no notebook'})\n")
            elif kind == "end":
                return _end(message, err)
    except (requests.RequestException, ValueError) as exc:
        err.write(f"stasis: the stream broke: {exc}\n")
        return EXIT_UNAVAILABLE
    err.write("stasis: the stream ended without a result\n")
    return EXIT_UNAVAILABLE


def _end(message: dict[str, Any], err: IO[str]) -> int:
    status = message.get("status")
    if status == "ok":
        return EXIT_OK
    if status == "error":
        return EXIT_CELL_ERROR
    err.write(f"stasis: {status}: {message.get('message') or message.get('reason')}\n")
    return EXIT_REFUSED if status in _REFUSED_ENDS else EXIT_UNAVAILABLE


def _refused(response: requests.Response, err: IO[str]) -> int:
    try:
        body = response.json()
        why = f"{body.get('error')}: {body.get('message')}"
    except ValueError:
        why = response.text[:300]
    retry = response.headers.get("Retry-After")
    err.write(f"stasis: refused ({response.status_code}) {why}"
              + (f" (retry after {retry} s)" if retry else "") + "\n")
    return exit_for(response.status_code)


def exit_for(status_code: int) -> int:
    """The exit status for a proxy's refusal: a server error or a rate limit (429, with its
    Retry-After) is worth retrying (4); anything else the link itself was refused (3)."""
    return EXIT_UNAVAILABLE if status_code >= 500 or status_code == 429 else EXIT_REFUSED


def _is_loopback(address: LinkAddress) -> bool:
    return "://127.0.0.1" in address.proxy_url or "://localhost" in address.proxy_url
