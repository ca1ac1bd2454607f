"""Credentials out of anything shown or logged: one pure function, :func:`redact`.

Sandbox tasks are typed by people and agents, and they carry credentials more often than
anyone would like: a private repository as ``https://user:token@host/org/repo.git``, a
command with ``--token=…``, ``curl -H "Authorization: Bearer …"``, ``GITHUB_TOKEN=… make``.
The stored request keeps what was asked (the runner needs the URL it clones), but every
place that shows one passes it through :func:`redact` first (the dashboard, the portal,
chat, the links proxy's sandbox records, the CLI, and the task's own log, which repeats the
command, wherever it is shown; no log line of the control plane carries a task), so a team
admin reading the fleet, or a log reader, never sees another person's secret.

What is replaced by ``***`` (the shape stays, so a reader still sees what was run):

- the user information of a URL (``scheme://user:password@host`` -> ``scheme://***@host``;
  an scp-like ``git@host:org/repo`` has none and is kept);
- the value of an option named like a credential (``--token=x``, ``--password x``,
  ``--api-key``, ``--secret``, ``--auth``, ``--credentials``...);
- an ``Authorization`` / ``Proxy-Authorization`` header's credentials (the scheme stays);
- an environment assignment named like a credential (``GITHUB_TOKEN=x``, ``DB_PASSWORD=x``);
- a URL query parameter named like one (``?access_token=x``, ``&sig=x``);
- a Stasis link token (``stasis_`` and 43 characters).

Redaction is idempotent, and never raises: anything not a string is shown as ``str()`` of
it, redacted.
"""

from __future__ import annotations

import re

MASK = "***"
_SECRET_WORD = (r"(?:token|password|passwd|pwd|secret|api[-_]?key|apikey|auth|credentials?|"
                r"private[-_]?key)")
_USERINFO = re.compile(r"([a-z][a-z0-9+.-]*://)[^/@\s]+@", re.IGNORECASE)
#: A value: quoted (spaces and all), or up to the next space or quote.
_VALUE = r"(?:\"[^\"]*\"|'[^']*'|[^\s'\"&]+)"
# The credential word is a whole part of the name (--api-token, not --tokenizer).
_OPTION = re.compile(r"(--?(?:[a-z0-9]+-)*" + _SECRET_WORD + r"(?:-[a-z0-9]+)*)(=|\s+)(?!-)"
                     + _VALUE, re.IGNORECASE)
_HEADER = re.compile(r"((?:proxy-)?authorization\s*:\s*)(?:(bearer|basic|token|digest)\s+)?"
                     r"[^\s'\"]+", re.IGNORECASE)
_ASSIGNMENT = re.compile(r"\b((?:[a-z0-9]+_)*" + _SECRET_WORD + r"(?:_[a-z0-9]+)*)="
                         + _VALUE, re.IGNORECASE)
_QUERY = re.compile(r"([?&](?:access_token|token|key|api_key|apikey|password|sig|signature|"
                    r"secret|auth)=)[^&#\s'\"]+", re.IGNORECASE)
_LINK_TOKEN = re.compile(r"stasis_[A-Za-z0-9_-]{43}(?![A-Za-z0-9_-])")


def redact(value: object) -> str:
    """``value`` as text, with every credential it shows replaced by ``***`` (see the
    module docstring for what counts)."""
    text = value if isinstance(value, str) else ("" if value is None else str(value))
    if not text:
        return text
    text = _LINK_TOKEN.sub("stasis_" + MASK, text)
    text = _USERINFO.sub(r"\1" + MASK + "@", text)
    text = _HEADER.sub(lambda m: m.group(1) + (m.group(2) + " " if m.group(2) else "") + MASK,
                       text)
    text = _OPTION.sub(lambda m: m.group(1) + m.group(2) + MASK, text)
    text = _ASSIGNMENT.sub(lambda m: m.group(1) + "=" + MASK, text)
    return _QUERY.sub(r"\1" + MASK, text)
