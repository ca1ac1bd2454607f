"""Revocable links for coding agents: the pure rules.

A link lets a coding agent on a laptop run code in one workspace (scope ``exec``), read
its Jupyter REST API (scope ``read``) or hand tasks to agent sandboxes for the workspace's
team (scope ``sandbox``; ``exec`` may too) with nothing but a URL. What this module
decides, with no I/O (time is passed in):

- **The token.** ``stasis_`` + 43 URL-safe characters (``secrets.token_urlsafe(32)``: 256
  random bits). The prefix makes a leaked token recognisable by secret scanners and lets the
  proxy refuse garbage without a lookup. Only ``token_hash`` (SHA-256, hex) is stored: it is
  the id of the ``links/{hash}`` document. The public ``link_id`` (``lnk-`` + 16 hex) is
  random and says nothing about the token.
- **The link URL.** ``http://127.0.0.1:8713/proxy/<workspace>#<token>``: the token rides in
  the fragment, which HTTP clients never send, so it never lands in a query string, a
  server's access log or a browser's history of requests. ``stasis exec`` takes it from the
  fragment and sends ``Authorization: Bearer <token>``. A token found anywhere in a request
  URL is refused (:func:`token_in_url`).
- **TTL.** Default one hour, capped by policy (a longer request is cut to the cap, with a
  notice); a link cannot live less than a minute.
- **Rights.** A team admin may link any of the team's workspaces; a member their own; a
  viewer their own, read only (:func:`rights`). Checked at creation and again on every
  request, so a creator removed from the team or demoted takes their links down with them.
- **The per-request check** (:func:`check_request`): an early-return ladder over the link,
  the creator's current role and the workspace, ending in a :class:`Verdict` whose
  :class:`Reason` maps to one HTTP status (:data:`HTTP_STATUS`).
- **Sandboxes through a link** (:data:`Operation.SANDBOX`): a request runs as the link's
  creator in the link's team. ``exec`` allows it, since an exec link already runs any code
  with the workspace's rights and a sandbox is strictly more confined; ``read`` does not,
  since a sandbox spends the team's compute; ``sandbox`` allows only this, for an agent that
  delegates tasks but must not touch the notebook's kernel or files. A sandbox does not run
  in the workspace, so the workspace's state does not matter (a paused one stays paused:
  the tasks go on after the user logged off); a deleted workspace takes its links along.
- **Rate limits**: token-bucket arithmetic (:func:`take`) for the per-link limit and for
  the per-client budget of failed attempts (brute force).

The revocation promise (effective within one second, open streams included) is an
invariant of :class:`LinkPolicy`: the proxy's cache TTL plus its re-check interval must
stay under a second.
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field, replace
from datetime import datetime, timedelta
from enum import StrEnum
from urllib.parse import parse_qsl, unquote, urlsplit, urlunsplit

from functions.domain.catalog import Role

TOKEN_PREFIX = "stasis_"
#: secrets.token_urlsafe(32): 32 random bytes, 43 URL-safe base64 characters.
TOKEN_BYTES = 32
_TOKEN = re.compile(re.escape(TOKEN_PREFIX) + r"[A-Za-z0-9_-]{43}")
_TOKEN_ANYWHERE = re.compile(re.escape(TOKEN_PREFIX) + r"[A-Za-z0-9_-]{43}(?![A-Za-z0-9_-])")
LINK_ID_PREFIX = "lnk-"
_LINK_ID = re.compile(re.escape(LINK_ID_PREFIX) + r"[0-9a-f]{16}")
#: Query parameter names that carry credentials elsewhere (Jupyter takes ``?token=``).
_CREDENTIAL_PARAMS = frozenset({"token", "access_token", "link", "key", "api_key"})
_LOOPBACK = frozenset({"127.0.0.1", "localhost", "::1"})


class Scope(StrEnum):
    EXEC = "exec"
    READ = "read"
    SANDBOX = "sandbox"


class Operation(StrEnum):
    """What a proxied request does; a scope allows a set of them."""

    EXECUTE = "execute"  # run code in a kernel
    READ = "read"  # GET the link's info or the Jupyter REST API
    WRITE = "write"  # any other method on the Jupyter REST API
    SANDBOX = "sandbox"  # request an agent sandbox for the team, read its result


SCOPE_OPERATIONS: Mapping[Scope, frozenset[Operation]] = {
    Scope.EXEC: frozenset({Operation.EXECUTE, Operation.READ, Operation.WRITE,
                           Operation.SANDBOX}),
    Scope.READ: frozenset({Operation.READ}),
    Scope.SANDBOX: frozenset({Operation.SANDBOX}),
}


class Reason(StrEnum):
    """Why a link request or a link operation was decided so; str values to prevent typos."""

    OK = "ok"
    RESUMING = "resuming"  # the workspace is paused: resume it, then go ahead
    WAITING = "waiting"  # the workspace is on its way to RUNNING: wait
    # refusals
    TOKEN_IN_URL = "token_in_url"
    BAD_PATH = "bad_path"  # still percent-encoded after decoding, or a dot segment
    UNAUTHENTICATED = "unauthenticated"  # no verified caller identity (IAP)
    MISSING_TOKEN = "missing_token"
    MALFORMED_TOKEN = "malformed_token"
    UNKNOWN_LINK = "unknown_link"
    REVOKED = "revoked"
    EXPIRED = "expired"
    TOO_MANY_FAILURES = "too_many_failures"
    RATE_LIMITED = "rate_limited"
    WRONG_WORKSPACE = "wrong_workspace"
    OTHER_TEAM = "other_team"
    CREATOR_NOT_MEMBER = "creator_not_member"
    CREATOR_NO_RIGHTS = "creator_no_rights"
    NOT_MEMBER = "not_member"  # a signed-in user who is not in the workspace's team
    NO_RIGHTS = "no_rights"  # a member who is neither the owner nor a team admin
    SCOPE = "insufficient_scope"
    UNKNOWN_OPERATION = "unknown_operation"
    WORKSPACE_GONE = "workspace_gone"
    WORKSPACE_FAILED = "workspace_failed"
    WORKSPACE_PAUSED = "workspace_paused"
    WORKSPACE_QUEUED = "workspace_queued"  # waiting for capacity: may be hours, so not waited
    UNAVAILABLE = "unavailable"
    # creation and revocation
    BAD_TTL = "bad_ttl"
    BAD_SCOPE = "bad_scope"
    TOO_MANY_LINKS = "too_many_links"
    NOT_ALLOWED = "not_allowed"
    ALREADY_REVOKED = "already_revoked"


#: The HTTP status of every reason. 401: the token does not authenticate (missing,
#: malformed, unknown, revoked, expired); 403: it authenticates but may not do this;
#: 429: slow down (Retry-After says how long).
HTTP_STATUS: Mapping[Reason, int] = {
    Reason.OK: 200,
    Reason.RESUMING: 202,
    Reason.WAITING: 202,
    Reason.TOKEN_IN_URL: 400,
    Reason.BAD_PATH: 400,
    Reason.UNAUTHENTICATED: 401,
    Reason.MISSING_TOKEN: 401,
    Reason.MALFORMED_TOKEN: 401,
    Reason.UNKNOWN_LINK: 401,
    Reason.REVOKED: 401,
    Reason.EXPIRED: 401,
    Reason.TOO_MANY_FAILURES: 429,
    Reason.RATE_LIMITED: 429,
    Reason.WRONG_WORKSPACE: 403,
    Reason.OTHER_TEAM: 403,
    Reason.CREATOR_NOT_MEMBER: 403,
    Reason.CREATOR_NO_RIGHTS: 403,
    Reason.NOT_MEMBER: 403,
    Reason.NO_RIGHTS: 403,
    Reason.SCOPE: 403,
    Reason.UNKNOWN_OPERATION: 404,
    Reason.WORKSPACE_GONE: 410,
    Reason.WORKSPACE_FAILED: 409,
    Reason.WORKSPACE_PAUSED: 409,
    Reason.WORKSPACE_QUEUED: 503,
    Reason.UNAVAILABLE: 503,
    Reason.BAD_TTL: 400,
    Reason.BAD_SCOPE: 400,
    Reason.TOO_MANY_LINKS: 409,
    Reason.NOT_ALLOWED: 403,
    Reason.ALREADY_REVOKED: 200,
}


class Outcome(StrEnum):
    ALLOW = "allow"
    RESUME = "resume"  # publish workspace.resume_requested, then wait for RUNNING
    WAIT = "wait"  # wait for RUNNING (provisioning, resuming, pausing)
    DENY = "deny"


# --------------------------------------------------------------------------------------------
# Policy and rates
# --------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Rate:
    """A token bucket: ``burst`` at once, refilled at ``per_second``."""

    per_second: float
    burst: int

    def __post_init__(self) -> None:
        if self.per_second <= 0 or self.burst < 1:
            raise ValueError(f"a rate needs per_second > 0 and burst >= 1, got {self}")


@dataclass(frozen=True)
class LinkPolicy:
    """How links behave; one place for every number the proxy and the issuer use."""

    default_ttl_seconds: int = 3600
    max_ttl_seconds: int = 12 * 3600
    min_ttl_seconds: int = 60
    max_active_per_workspace: int = 20
    #: Requests per link (per proxy instance).
    link_rate: Rate = field(default_factory=lambda: Rate(10.0, 20))
    #: Failed attempts (401s) per client before it is told to wait: the brute-force limit.
    failure_rate: Rate = field(default_factory=lambda: Rate(0.2, 10))
    #: How long the proxy trusts what it read about a link, a team or a workspace.
    cache_seconds: float = 0.5
    #: How often an open stream re-checks its link.
    recheck_seconds: float = 0.2
    #: How long a request waits for a paused (or starting) workspace to be RUNNING.
    resume_wait_seconds: float = 180.0
    #: Scopes whose requests may resume a paused workspace (a resume costs hardware).
    resume_scopes: frozenset[Scope] = frozenset({Scope.EXEC})
    max_code_bytes: int = 1 << 20
    max_exec_seconds: float = 3600.0

    def __post_init__(self) -> None:
        if not 0 < self.min_ttl_seconds <= self.default_ttl_seconds <= self.max_ttl_seconds:
            raise ValueError("need 0 < min_ttl <= default_ttl <= max_ttl")
        # The revocation promise: a revoked link stops working within one second, and an
        # open stream notices within cache + recheck.
        if self.cache_seconds + self.recheck_seconds >= 1.0:
            raise ValueError("cache_seconds + recheck_seconds must stay under 1 s: a "
                             "revocation must take effect within one second")


DEFAULT_POLICY = LinkPolicy()


@dataclass(frozen=True)
class Bucket:
    """A token bucket's state: ``tokens`` left at monotonic time ``at``."""

    tokens: float
    at: float


def _refilled(bucket: Bucket | None, now: float, rate: Rate) -> float:
    if bucket is None:
        return float(rate.burst)
    return min(float(rate.burst), bucket.tokens + max(0.0, now - bucket.at) * rate.per_second)


def take(bucket: Bucket | None, now: float, rate: Rate, cost: float = 1.0
         ) -> tuple[bool, Bucket, float]:
    """Take ``cost`` from the bucket: (allowed, the bucket after, seconds until allowed).

    A refused take leaves the tokens as they were (refilled to ``now``), so a client that
    keeps hammering does not dig itself deeper, and ``retry_after`` stays honest.
    """
    tokens = _refilled(bucket, now, rate)
    if tokens >= cost:
        return True, Bucket(tokens - cost, now), 0.0
    return False, Bucket(tokens, now), (cost - tokens) / rate.per_second


def available(bucket: Bucket | None, now: float, rate: Rate) -> float:
    """Tokens in the bucket at ``now`` (without taking any)."""
    return _refilled(bucket, now, rate)


# --------------------------------------------------------------------------------------------
# Tokens, ids and link URLs
# --------------------------------------------------------------------------------------------


def is_well_formed(token: str) -> bool:
    """Whether ``token`` has the shape of a link token (says nothing about its validity)."""
    return bool(_TOKEN.fullmatch(token))


def token_hash(token: str) -> str:
    """The SHA-256 of a token, hex: the only form in which a token is stored."""
    return hashlib.sha256(token.encode()).hexdigest()


def is_link_id(value: str) -> bool:
    return bool(_LINK_ID.fullmatch(value))


def link_id_from(random_hex: str) -> str:
    """A link id from 16 random hex digits (``secrets.token_hex(8)``)."""
    link_id = LINK_ID_PREFIX + random_hex
    if not is_link_id(link_id):
        raise ValueError("a link id takes 16 lowercase hex digits")
    return link_id


def bearer_token(authorization: str | None) -> str | None:
    """The credential of an ``Authorization: Bearer <token>`` header, or None."""
    if not authorization:
        return None
    scheme, _, credential = authorization.strip().partition(" ")
    if scheme.lower() != "bearer":
        return None
    return credential.strip() or None


def tokens_in(text: str) -> list[str]:
    """Every well-formed link token inside ``text`` (e.g. a URL that leaked one)."""
    return _TOKEN_ANYWHERE.findall(unquote(text))


def token_in_url(path: str, query: str) -> bool:
    """Whether a request URL carries a credential: a link token anywhere in the path or the
    query, or a query parameter named like a credential (``token``, ``access_token``...).

    Such requests are refused: URLs are logged by proxies, load balancers and servers.
    """
    decoded = unquote(path) + "?" + unquote(query)
    if TOKEN_PREFIX in decoded:
        return True
    return any(name.lower() in _CREDENTIAL_PARAMS
               for name, _ in parse_qsl(query, keep_blank_values=True))


@dataclass(frozen=True)
class LinkAddress:
    """What a link URL says: where the proxy is, which workspace, and the token."""

    proxy_url: str  # e.g. http://127.0.0.1:8713/proxy
    workspace_id: str
    token: str

    @property
    def workspace_url(self) -> str:
        return f"{self.proxy_url}/{self.workspace_id}"


def link_url(proxy_url: str, workspace_id: str, token: str) -> str:
    """The URL shown once to the link's creator: the token in the fragment."""
    return f"{proxy_url.rstrip('/')}/{workspace_id}#{token}"


def parse_link_url(url: str) -> LinkAddress:
    """Split a link URL into proxy, workspace and token; ``ValueError`` says what is wrong.

    ``stasis+http(s)://`` is accepted as an alias. Plain http is only accepted to a loopback
    host: the token must not cross a network in clear text.
    """
    raw = url.strip()
    if raw.startswith("stasis+"):
        raw = raw.removeprefix("stasis+")
    parts = urlsplit(raw)
    if parts.scheme not in ("http", "https") or not parts.netloc:
        raise ValueError("a link looks like https://HOST/proxy/<team>--<name>#<token>")
    if parts.query:
        raise ValueError("a link carries no query string; the token goes after '#'")
    if parts.scheme == "http" and (parts.hostname or "") not in _LOOPBACK:
        raise ValueError(f"refusing to send a token over plain http to {parts.hostname}: "
                         "use https")
    token = unquote(parts.fragment)
    if not token:
        raise ValueError("the link has no token: it ends with '#<token>'")
    if not is_well_formed(token):
        raise ValueError("the token after '#' is not a Stasis link token")
    path = parts.path.rstrip("/")
    base, _, workspace_id = path.rpartition("/")
    if "--" not in workspace_id:
        raise ValueError("the link's path must end with the workspace id <team>--<name>")
    return LinkAddress(urlunsplit((parts.scheme, parts.netloc, base, "", "")), workspace_id,
                       token)


# --------------------------------------------------------------------------------------------
# TTL
# --------------------------------------------------------------------------------------------

_TTL_PART = re.compile(r"(\d+)([dhms])")
_UNIT_SECONDS = {"d": 86400, "h": 3600, "m": 60, "s": 1}


def parse_ttl(text: str) -> int:
    """Seconds in ``"1h"``, ``"30m"``, ``"2h30m"``, ``"1d"``, ``"90s"`` or ``"600"``."""
    value = text.strip().lower()
    if value.isdigit():
        return int(value)
    if value and "".join(m.group(0) for m in _TTL_PART.finditer(value)) == value:
        return sum(int(n) * _UNIT_SECONDS[u] for n, u in _TTL_PART.findall(value))
    raise ValueError(f"{text!r} is not a duration: write e.g. 30m, 1h, 2h30m or 1d")


def format_ttl(seconds: int) -> str:
    parts = []
    for unit in ("d", "h", "m", "s"):
        n, seconds = divmod(seconds, _UNIT_SECONDS[unit])
        if n:
            parts.append(f"{n}{unit}")
    return "".join(parts) or "0s"


# --------------------------------------------------------------------------------------------
# Links, workspaces, rights
# --------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Link:
    """A link as stored (``links/{token_hash}``), without the token."""

    link_id: str
    workspace: str
    team: str
    creator: str
    scope: Scope
    created_at: datetime
    expires_at: datetime
    revoked_at: datetime | None = None
    revoked_by: str | None = None
    revoke_reason: str | None = None
    #: The workspace incarnation it was made for (``Workspace.incarnation``): a later
    #: workspace of the same id is another one, and the link is not for it.
    incarnation: str | None = None

    def status(self, now: datetime) -> str:
        """``active``, ``expired`` or ``revoked``, for listings."""
        if self.revoked_at is not None:
            return "revoked"
        return "expired" if now >= self.expires_at else "active"


@dataclass(frozen=True)
class Target:
    """What the rules need to know about the workspace a link points at."""

    id: str
    team: str
    owner: str
    state: str  # functions.domain.lifecycle.State value
    version: int = 0
    incarnation: str | None = None


def rights(role: Role | None, *, is_owner: bool) -> frozenset[Scope]:
    """The scopes a user may grant on a workspace: admins any of the team's workspaces,
    members their own, viewers their own read only; non-members nothing."""
    if role is None:
        return frozenset()
    if role == Role.ADMIN:
        return frozenset(Scope)
    if not is_owner:
        return frozenset()
    return frozenset(Scope) if role == Role.MEMBER else frozenset({Scope.READ})


def role_in(members: Iterable[Mapping[str, object]], user: str) -> Role | None:
    """A user's role in a team document's ``members`` list, or None."""
    for member in members:
        if member.get("user") == user:
            try:
                return Role(str(member.get("role")))
            except ValueError:
                return None
    return None


# --------------------------------------------------------------------------------------------
# Decisions
# --------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Verdict:
    """A decision with its named reason and a message that tells the caller what to do."""

    outcome: Outcome
    reason: Reason
    message: str = ""
    retry_after: float | None = None

    @property
    def status(self) -> int:
        return HTTP_STATUS[self.reason]

    @property
    def allowed(self) -> bool:
        return self.outcome == Outcome.ALLOW

    @property
    def authenticated(self) -> bool:
        """False for the refusals that count against a client's failure budget (401)."""
        return self.status != 401


def deny(reason: Reason, message: str, retry_after: float | None = None) -> Verdict:
    return Verdict(Outcome.DENY, reason, message, retry_after)


ALLOWED = Verdict(Outcome.ALLOW, Reason.OK)
_WAIT_STATES = frozenset({"REQUESTED", "PROVISIONING", "RESUMING", "PAUSING"})
#: A QUEUED workspace waits for capacity, minutes to hours: a request is refused at once
#: (not held for ``resume_wait_seconds``) and told to come back after this long.
QUEUED_RETRY_SECONDS = 60.0


def check_token(path: str, query: str, authorization: str | None) -> Verdict | str:
    """The checks that need no lookup: the token's place and shape. The token, or a denial."""
    if token_in_url(path, query):
        return deny(Reason.TOKEN_IN_URL, "a link token must never be in a URL (URLs are "
                    "logged): send it as 'Authorization: Bearer <token>'; `stasis exec "
                    "--link URL` does")
    token = bearer_token(authorization)
    if token is None:
        return deny(Reason.MISSING_TOKEN, "send the link's token as 'Authorization: Bearer "
                    "<token>'")
    if not is_well_formed(token):
        return deny(Reason.MALFORMED_TOKEN, "that is not a Stasis link token")
    return token


def check_request(link: Link | None, *, now: datetime, workspace_id: str,
                  operation: Operation, creator_role: Role | None, workspace: Target | None,
                  policy: LinkPolicy = DEFAULT_POLICY) -> Verdict:
    """Whether a request with this link may do ``operation`` on ``workspace_id`` now.

    ``creator_role`` is the link creator's current role in the link's team (None: not a
    member any more); ``workspace`` the workspace's current document (None: gone).
    """
    if link is None:
        # Unknown token: never existed, or mistyped. Counts as a failed attempt.
        return deny(Reason.UNKNOWN_LINK, "this link is not valid: ask for a new one")
    if link.revoked_at is not None:
        who = f" by {link.revoked_by}" if link.revoked_by else ""
        return deny(Reason.REVOKED, f"link {link.link_id} was revoked{who}: ask for a new one")
    if now >= link.expires_at:
        return deny(Reason.EXPIRED, f"link {link.link_id} expired at "
                    f"{link.expires_at.isoformat()}: ask for a new one")
    if workspace_id != link.workspace:
        # The link names its workspace; a request for another one is never redirected.
        return deny(Reason.WRONG_WORKSPACE, f"link {link.link_id} is for workspace "
                    f"{link.workspace}, not {workspace_id}")
    if workspace is None or workspace.state == "DELETED":
        return deny(Reason.WORKSPACE_GONE, f"workspace {link.workspace} no longer exists")
    if workspace.incarnation != link.incarnation:
        # Same id, another workspace (deleted and created again, maybe by someone else).
        return deny(Reason.WORKSPACE_GONE, f"link {link.link_id} was for an earlier workspace "
                    f"{link.workspace}, since deleted: ask for a new one")
    if workspace.team != link.team:
        return deny(Reason.OTHER_TEAM, f"workspace {workspace.id} belongs to team "
                    f"{workspace.team}, and link {link.link_id} to team {link.team}")
    if creator_role is None:
        # Rights are the creator's, re-checked on every request: leaving the team ends them.
        return deny(Reason.CREATOR_NOT_MEMBER, f"{link.creator}, who created link "
                    f"{link.link_id}, is no longer a member of team {link.team}")
    if link.scope not in rights(creator_role, is_owner=workspace.owner == link.creator):
        return deny(Reason.CREATOR_NO_RIGHTS, f"{link.creator} ({creator_role}) may no longer "
                    f"grant {link.scope} on {workspace.id}")
    if operation not in SCOPE_OPERATIONS[link.scope]:
        return deny(Reason.SCOPE, f"link {link.link_id} has scope {link.scope}, which does "
                    f"not allow {operation}")
    if operation == Operation.SANDBOX:
        # A sandbox runs beside the workspace, not in it: nothing to resume or wait for.
        if workspace.state == "DELETING":
            return deny(Reason.WORKSPACE_GONE, f"workspace {workspace.id} is being deleted")
        return ALLOWED
    return _by_state(link, workspace, policy)


def _by_state(link: Link, workspace: Target, policy: LinkPolicy) -> Verdict:
    # A resume takes hardware: only scopes allowed to spend it resume.
    return state_verdict(workspace, resumes=link.scope in policy.resume_scopes,
                         paused=f"workspace {workspace.id} is paused and a {link.scope} link "
                                "does not resume it: ask its owner to resume it")


def state_verdict(workspace: Target, *, resumes: bool, paused: str = "") -> Verdict:
    """What the workspace's state means for a request that may otherwise reach it, the same
    for an agent link and a browser session (``functions.domain.ide``): RUNNING passes;
    PAUSED is resumed when ``resumes`` (else refused with the message ``paused``); on its
    way to RUNNING (or to PAUSED) it is waited for; QUEUED (waiting for capacity) is refused
    at once with a Retry-After; deleting, deleted or failed refuse."""
    state = workspace.state
    if state == "RUNNING":
        return ALLOWED
    if state == "PAUSED":
        if not resumes:
            return deny(Reason.WORKSPACE_PAUSED,
                        paused or f"workspace {workspace.id} is paused")
        return Verdict(Outcome.RESUME, Reason.RESUMING,
                       f"workspace {workspace.id} is paused: resuming it")
    if state in _WAIT_STATES:
        return Verdict(Outcome.WAIT, Reason.WAITING,
                       f"workspace {workspace.id} is {state.lower()}: waiting for it")
    if state == "QUEUED":
        return deny(Reason.WORKSPACE_QUEUED,
                    f"workspace {workspace.id} is queued for capacity: it starts when its "
                    "hardware frees (`stasis ws status` shows its place and estimate)",
                    QUEUED_RETRY_SECONDS)
    if state == "DELETING":
        return deny(Reason.WORKSPACE_GONE, f"workspace {workspace.id} is being deleted")
    return deny(Reason.WORKSPACE_FAILED, f"workspace {workspace.id} is {state}"
                + (": see `stasis ws status`" if state == "FAILED" else ""))


_STILL_ENCODED = re.compile(r"%[0-9A-Fa-f]{2}")


def normal_path(subpath: str) -> str | None:
    """The proxied path (once decoded, as the HTTP server hands it over) in the one form the
    operation is decided on and the request forwarded with: its segments joined by single
    slashes. None for a path that could mean something else further on: one still
    percent-encoded (``%2e%2e`` from a double-encoded ``%252e%252e`` would be decoded again
    by Jupyter into ``..``), a dot segment, a backslash or a control character."""
    if _STILL_ENCODED.search(subpath) or "\\" in subpath or any(
            ord(c) < 0x20 or ord(c) == 0x7F for c in subpath):
        return None
    segments = [s for s in subpath.split("/") if s]
    if any(s in (".", "..") for s in segments):
        return None
    return "/".join(segments)


#: The refusal of a path :func:`normal_path` does not take.
BAD_PATH = Verdict(Outcome.DENY, Reason.BAD_PATH,
                   "the path has a dot segment or is still percent-encoded after decoding "
                   "(double encoding): send each character encoded once")


def operation_for(method: str, subpath: str) -> Operation | None:
    """The operation of a proxied request (``subpath`` after ``/proxy/<workspace>``), or
    None for anything the proxy does not serve."""
    method = method.upper()
    segments = [s for s in subpath.split("/") if s]
    if any(s in (".", "..") for s in segments):
        return None
    if not segments:
        return Operation.READ if method in ("GET", "HEAD") else None
    if segments == ["execute"]:
        return Operation.EXECUTE if method == "POST" else None
    if segments[:2] == ["stasis", "sandboxes"]:
        return _sandbox_operation(method, segments[2:])
    if segments[0] == "api":
        if len(segments) > 1 and segments[-1] == "channels":
            return None  # websockets are not proxied; use /execute
        return Operation.READ if method in ("GET", "HEAD") else Operation.WRITE
    return None


SANDBOX_ID = re.compile(r"[a-z0-9][a-z0-9-]{1,61}[a-z0-9]")


def _sandbox_operation(method: str, rest: list[str]) -> Operation | None:
    """``POST stasis/sandboxes`` (request one), ``GET stasis/sandboxes`` (the creator's),
    ``GET stasis/sandboxes/<id>`` (state and patch), ``GET .../<id>/patch`` (raw) and
    ``POST .../<id>/resume`` (a suspended one)."""
    if not rest:
        return Operation.SANDBOX if method in ("POST", "GET", "HEAD") else None
    if not SANDBOX_ID.fullmatch(rest[0]) or len(rest) > 2:
        return None
    if rest[1:] == ["resume"]:
        return Operation.SANDBOX if method == "POST" else None
    if rest[1:] not in ([], ["patch"]):
        return None
    return Operation.SANDBOX if method in ("GET", "HEAD") else None


# --------------------------------------------------------------------------------------------
# Creation and revocation
# --------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Issue:
    """A link that may be created: when it expires, and notices for the creator."""

    expires_at: datetime
    ttl_seconds: int
    notices: tuple[str, ...] = ()


@dataclass(frozen=True)
class Refused:
    reason: Reason
    message: str

    @property
    def status(self) -> int:
        return HTTP_STATUS[self.reason]


def check_create(*, creator: str, creator_role: Role | None, workspace_id: str,
                 workspace: Target | None, scope: str, ttl_seconds: int | None,
                 active_links: int, now: datetime,
                 policy: LinkPolicy = DEFAULT_POLICY) -> Issue | Refused:
    """Whether ``creator`` may create a ``scope`` link to ``workspace_id`` now, and until when."""
    if scope not in set(Scope):
        return Refused(Reason.BAD_SCOPE, f"scope {scope!r}: use exec, read or sandbox")
    if workspace is None or workspace.state in ("DELETED", "DELETING"):
        return Refused(Reason.WORKSPACE_GONE, f"no workspace {workspace_id}")
    if creator_role is None:
        return Refused(Reason.CREATOR_NOT_MEMBER,
                       f"{creator} is not a member of team {workspace.team}")
    allowed = rights(creator_role, is_owner=workspace.owner == creator)
    if Scope(scope) not in allowed:
        which = "only read links" if allowed else "no links"
        return Refused(Reason.CREATOR_NO_RIGHTS,
                       f"{creator} ({creator_role} of {workspace.team}) may create {which} to "
                       f"{workspace_id}: owners link their own workspaces, team admins any")
    if workspace.state == "FAILED":
        return Refused(Reason.WORKSPACE_FAILED, f"workspace {workspace_id} is FAILED")
    if active_links >= policy.max_active_per_workspace:
        return Refused(Reason.TOO_MANY_LINKS,
                       f"{workspace_id} has {active_links} active links (at most "
                       f"{policy.max_active_per_workspace}): revoke some (`stasis link list`)")
    seconds = policy.default_ttl_seconds if ttl_seconds is None else ttl_seconds
    if seconds < policy.min_ttl_seconds:
        return Refused(Reason.BAD_TTL, f"a link lives at least "
                       f"{format_ttl(policy.min_ttl_seconds)}")
    notices: tuple[str, ...] = ()
    if seconds > policy.max_ttl_seconds:
        notices = (f"TTL {format_ttl(seconds)} capped to {format_ttl(policy.max_ttl_seconds)} "
                   "by policy",)
        seconds = policy.max_ttl_seconds
    return Issue(now + timedelta(seconds=seconds), seconds, notices)


#: Who revoked, and why, the links a deleted workspace takes with it.
WORKSPACE_DELETED_BY = "stasis"
WORKSPACE_DELETED = "workspace_deleted"


def revoked_with_workspace(now: datetime) -> dict[str, object]:
    """The fields that revoke a link because its workspace was deleted (every link of a
    workspace is revoked when it reaches DELETED, so none outlives it)."""
    return {"revoked_at": now, "revoked_by": WORKSPACE_DELETED_BY,
            "revoke_reason": WORKSPACE_DELETED}


def check_revoke(link: Link | None, *, actor: str, actor_role: Role | None,
                 now: datetime) -> Link | Refused:
    """The link as revoked by ``actor``, or why not. The creator and team admins may."""
    if link is None:
        return Refused(Reason.UNKNOWN_LINK, "no such link")
    if actor != link.creator and actor_role != Role.ADMIN:
        return Refused(Reason.NOT_ALLOWED, f"only {link.creator} or an admin of team "
                       f"{link.team} may revoke {link.link_id}")
    if link.revoked_at is not None:
        return Refused(Reason.ALREADY_REVOKED, f"{link.link_id} was already revoked")
    return replace(link, revoked_at=now, revoked_by=actor, revoke_reason="revoked")
