"""Kubernetes names for anything: one slug helper, valid for any input, never colliding.

Every object Stasis creates in a cluster is named after something users chose (a team id, a
workspace name, a snapshot id) that Kubernetes may not accept as a name: upper case,
underscores, dots, a leading digit for a Service, more than 63 characters. kubespawner's
``safe_slug`` shows the way, and this module keeps its two promises, checked by property
tests (``tests/unit/test_k8s_slugs.py``):

- **valid**: :func:`slug` returns a DNS-1123 label (``[a-z0-9]([-a-z0-9]*[a-z0-9])?``, at
  most 63 characters, or ``max_length``) for *any* string, the empty one included, so it
  is a valid namespace, Pod, PVC, Secret or label-value name;
- **collision-free**: distinct inputs give distinct slugs. A string that is already a
  label and contains no ``--`` is kept as it is (readable names stay readable); any other
  string becomes a readable rendering without ``--``, then ``--``, then 10 hex digits of
  the input's SHA-256. The two forms cannot meet (only the second contains ``--``), and two
  hashed inputs collide only if 40 bits of SHA-256 do.

:func:`name` puts a fixed prefix in front (``ws-``, ``home-``): a prefix that starts with a
letter also makes the result a DNS-1035 label, which Services require. Prefixes are
distinct per object kind, so a Pod and a PVC of the same workspace never share a name
either.
"""

from __future__ import annotations

import hashlib
import re

MAX_LABEL = 63
_LABEL = re.compile(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?")
_DNS1035 = re.compile(r"[a-z]([-a-z0-9]*[a-z0-9])?")
_NOT_ALLOWED = re.compile(r"[^a-z0-9]+")
_HASH_CHARS = 10
_SEPARATOR = "--"
# The shortest budget that still leaves one readable character: "x--" + hash.
_MIN_LENGTH = 1 + len(_SEPARATOR) + _HASH_CHARS


def is_label(text: str, *, max_length: int = MAX_LABEL) -> bool:
    """Whether ``text`` is a DNS-1123 label of at most ``max_length`` characters."""
    return len(text) <= max_length and _LABEL.fullmatch(text) is not None


def is_dns1035(text: str) -> bool:
    """Whether ``text`` is a DNS-1035 label (a Service name): a label that starts with a
    letter."""
    return len(text) <= MAX_LABEL and _DNS1035.fullmatch(text) is not None


def slug(text: str, *, max_length: int = MAX_LABEL) -> str:
    """A DNS-1123 label for ``text``, distinct for distinct ``text`` (see the module)."""
    if not _MIN_LENGTH <= max_length <= MAX_LABEL:
        raise ValueError(f"max_length must be between {_MIN_LENGTH} and {MAX_LABEL}")
    if is_label(text, max_length=max_length) and _SEPARATOR not in text:
        return text
    digest = hashlib.sha256(text.encode("utf-8", "surrogatepass")).hexdigest()[:_HASH_CHARS]
    room = max_length - len(_SEPARATOR) - _HASH_CHARS
    readable = _NOT_ALLOWED.sub("-", text.lower())[:room].strip("-") or "x"
    return f"{readable}{_SEPARATOR}{digest}"


def name(prefix: str, text: str, *, max_length: int = MAX_LABEL) -> str:
    """``prefix`` + :func:`slug` of ``text``, the whole at most ``max_length`` characters.

    ``prefix`` must itself be a label start (lower-case letters, digits, ``-``, starting
    with a letter) and end with ``-``; distinct texts still give distinct names.
    """
    if not re.fullmatch(r"[a-z][-a-z0-9]*-", prefix) or _SEPARATOR in prefix:
        raise ValueError(f"prefix {prefix!r} must look like 'ws-': a letter first, '-' last")
    return prefix + slug(text, max_length=max_length - len(prefix))
