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
  string becomes a readable rendering without ``--``, then ``--``, then 80 bits of the
  input's SHA-256 as 16 lower-case base32 characters (``a-z2-7``). The two forms cannot
  meet (only the second contains ``--``), and two hashed inputs collide only if 80 bits of
  SHA-256 do.

Why 80 bits: long ids that share their first characters share the readable part, so the
hash alone tells them apart, and a user who picks workspace names could search for a second
id whose name is another workspace's (a second preimage: about 2**bits hashes). 40 bits
(10 hex digits, the old length) is a laptop's afternoon; 64 bits is within reach of rented
hardware; 80 bits is about 10**24 SHA-256 evaluations, millions of GPU-years. Base32 packs
the 80 bits into the 16 characters 64 bits of hex would take, so a name still keeps 45
readable characters of its 63 (Kubernetes' label limit, which Pods, PVCs, Secrets,
namespaces and label values all satisfy).

:func:`name` puts a fixed prefix in front (``ws-``, ``home-``): a prefix that starts with a
letter also makes the result a DNS-1035 label, which Services require. Prefixes are
distinct per object kind, so a Pod and a PVC of the same workspace never share a name
either.

:func:`team_of` reads the other way: the team of a workspace id, which names its namespace.
"""

from __future__ import annotations

import base64
import hashlib
import re

MAX_LABEL = 63
_LABEL = re.compile(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?")
_DNS1035 = re.compile(r"[a-z]([-a-z0-9]*[a-z0-9])?")
_NOT_ALLOWED = re.compile(r"[^a-z0-9]+")
#: 80 bits of SHA-256 in base32 (5 bits a character): see the module docstring for why.
_HASH_BITS = 80
_HASH_CHARS = _HASH_BITS // 5
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
    digest = base64.b32encode(hashlib.sha256(text.encode("utf-8", "surrogatepass")).digest()
                              ).decode().lower()[:_HASH_CHARS]
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


def team_of(workspace_id: str) -> str:
    """The team of a workspace id (``<team>--<name>``; slugs never contain ``--``)."""
    team, separator, _ = workspace_id.partition("--")
    if not separator or not team:
        raise ValueError(f"{workspace_id!r} is not a workspace id (<team>--<name>)")
    return team
