"""The link rules (functions/domain/links.py), as tables: tokens and link URLs, TTL, rights,
the per-request check (every reason with its HTTP status), operations, rate arithmetic."""

from __future__ import annotations

import dataclasses
import json
import secrets
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
from jsonschema import Draft202012Validator, FormatChecker

from functions.domain.catalog import Role
from functions.domain.links import (
    DEFAULT_POLICY,
    HTTP_STATUS,
    TOKEN_PREFIX,
    Bucket,
    Issue,
    Link,
    LinkPolicy,
    Operation,
    Outcome,
    Rate,
    Reason,
    Refused,
    Scope,
    Target,
    available,
    bearer_token,
    check_create,
    check_request,
    check_revoke,
    check_token,
    format_ttl,
    is_well_formed,
    link_id_from,
    link_url,
    normal_path,
    operation_for,
    parse_link_url,
    parse_ttl,
    rights,
    role_in,
    take,
    token_hash,
    token_in_url,
    tokens_in,
)

NOW = datetime(2025, 6, 10, 12, 0, tzinfo=UTC)
TOKEN = TOKEN_PREFIX + "A" * 43
LINK = Link(link_id="lnk-0123456789abcdef", workspace="ml-a--nb", team="ml-a",
            creator="bob", scope=Scope.EXEC, created_at=NOW - timedelta(minutes=5),
            expires_at=NOW + timedelta(hours=1))
RUNNING = Target(id="ml-a--nb", team="ml-a", owner="bob", state="RUNNING", version=2)
SANDBOX_LINK = dataclasses.replace(LINK, scope=Scope.SANDBOX)


# --- tokens and URLs ------------------------------------------------------------------------------
def test_a_fresh_token_is_256_bits_with_the_prefix_and_only_its_hash_is_kept() -> None:
    token = TOKEN_PREFIX + secrets.token_urlsafe(32)
    assert is_well_formed(token) and len(token) == len(TOKEN_PREFIX) + 43
    assert token_hash(token) == __import__("hashlib").sha256(token.encode()).hexdigest()
    assert token not in token_hash(token)


@pytest.mark.parametrize("token, ok", [
    (TOKEN, True),
    (TOKEN[:-1], False),  # too short
    (TOKEN + "A", False),  # too long
    ("A" * 50, False),  # no prefix
    (TOKEN_PREFIX + "A" * 42 + "=", False),  # not URL-safe base64
    ("", False),
])
def test_token_shape(token: str, ok: bool) -> None:
    assert is_well_formed(token) is ok


def test_link_url_puts_the_token_in_the_fragment_and_parses_back() -> None:
    url = link_url("http://127.0.0.1:8713/proxy/", "ml-a--nb", TOKEN)
    assert url == f"http://127.0.0.1:8713/proxy/ml-a--nb#{TOKEN}"
    address = parse_link_url(url)
    assert (address.proxy_url, address.workspace_id, address.token) == (
        "http://127.0.0.1:8713/proxy", "ml-a--nb", TOKEN)
    assert address.workspace_url == "http://127.0.0.1:8713/proxy/ml-a--nb"
    assert parse_link_url("stasis+" + url) == address
    assert parse_link_url(f"https://stasis.example.com/proxy/ml-a--nb/#{TOKEN}").token == TOKEN


@pytest.mark.parametrize("url, why", [
    (f"http://127.0.0.1:8713/proxy/ml-a--nb?token={TOKEN}", "no query"),
    (f"http://stasis.example.com/proxy/ml-a--nb#{TOKEN}", "plain http"),
    ("http://127.0.0.1:8713/proxy/ml-a--nb", "no token"),
    ("http://127.0.0.1:8713/proxy/ml-a--nb#nope", "not a Stasis link token"),
    (f"http://127.0.0.1:8713/proxy/#{TOKEN}", "workspace id"),
    (f"ftp://127.0.0.1/proxy/ml-a--nb#{TOKEN}", "looks like"),
])
def test_bad_link_urls_are_refused_with_the_reason(url: str, why: str) -> None:
    with pytest.raises(ValueError, match=why):
        parse_link_url(url)


@pytest.mark.parametrize("path, query, found", [
    ("/ml-a--nb/execute", "", False),
    ("/ml-a--nb/api/contents", "content=0&type=file", False),
    ("/ml-a--nb/", f"t={TOKEN}", True),
    ("/ml-a--nb/", f"x=%73tasis_{'A' * 43}", True),  # percent-encoded
    (f"/ml-a--nb/{TOKEN}/execute", "", True),
    ("/ml-a--nb/api/sessions", "token=jupyter-token", True),  # Jupyter's own credential
    ("/ml-a--nb/", "access_token=x", True),
])
def test_a_credential_anywhere_in_the_url_is_detected(path: str, query: str,
                                                      found: bool) -> None:
    assert token_in_url(path, query) is found


def test_leaked_tokens_are_found_in_a_url() -> None:
    assert tokens_in(f"/p?a={TOKEN}&b=stasis_short") == [TOKEN]


@pytest.mark.parametrize("header, token", [
    (f"Bearer {TOKEN}", TOKEN), (f"bearer   {TOKEN} ", TOKEN), (f"Basic {TOKEN}", None),
    ("Bearer", None), ("", None), (None, None)])
def test_bearer_token(header: str | None, token: str | None) -> None:
    assert bearer_token(header) == token


@pytest.mark.parametrize("path, query, header, reason", [
    ("/ws/", f"token={TOKEN}", f"Bearer {TOKEN}", Reason.TOKEN_IN_URL),
    ("/ws/", "", None, Reason.MISSING_TOKEN),
    ("/ws/", "", "Basic dXNlcjpwYXNz", Reason.MISSING_TOKEN),
    ("/ws/", "", "Bearer abc", Reason.MALFORMED_TOKEN),
])
def test_check_token_refusals(path: str, query: str, header: str | None,
                              reason: Reason) -> None:
    verdict = check_token(path, query, header)
    assert not isinstance(verdict, str) and verdict.reason == reason
    assert verdict.status == HTTP_STATUS[reason] and verdict.message


def test_check_token_passes_a_well_formed_bearer_token() -> None:
    assert check_token("/ws/execute", "", f"Bearer {TOKEN}") == TOKEN


def test_link_ids_are_random_hex_and_validated() -> None:
    assert link_id_from("0123456789abcdef") == "lnk-0123456789abcdef"
    with pytest.raises(ValueError):
        link_id_from("XYZ")


# --- TTL ------------------------------------------------------------------------------------------
@pytest.mark.parametrize("text, seconds", [
    ("1h", 3600), ("30m", 1800), ("2h30m", 9000), ("1d", 86400), ("90s", 90), ("600", 600),
    (" 1H ", 3600)])
def test_parse_ttl(text: str, seconds: int) -> None:
    assert parse_ttl(text) == seconds


@pytest.mark.parametrize("text", ["", "h", "1x", "1h 30m", "-5m", "1.5h"])
def test_parse_ttl_refuses_garbage(text: str) -> None:
    with pytest.raises(ValueError, match="not a duration"):
        parse_ttl(text)


def test_format_ttl() -> None:
    assert [format_ttl(s) for s in (3600, 9000, 90, 0)] == ["1h", "2h30m", "1m30s", "0s"]


# --- rights ---------------------------------------------------------------------------------------
@pytest.mark.parametrize("role, owner, scopes", [
    (Role.ADMIN, False, {"exec", "read", "sandbox"}),
    (Role.ADMIN, True, {"exec", "read", "sandbox"}),
    (Role.MEMBER, True, {"exec", "read", "sandbox"}),
    (Role.MEMBER, False, set()),
    (Role.VIEWER, True, {"read"}),
    (Role.VIEWER, False, set()),
    (None, True, set()),
])
def test_rights(role: Role | None, owner: bool, scopes: set[str]) -> None:
    assert {str(s) for s in rights(role, is_owner=owner)} == scopes


def test_role_in_a_team_document() -> None:
    members = [{"user": "alice", "role": "admin"}, {"user": "bob", "role": "member"},
               {"user": "eve", "role": "superuser"}]
    assert role_in(members, "alice") == Role.ADMIN
    assert role_in(members, "bob") == Role.MEMBER
    assert role_in(members, "eve") is None  # an unknown role grants nothing
    assert role_in(members, "mallory") is None


# --- the per-request check ------------------------------------------------------------------------
def _check(link: Link | None = LINK, *, workspace_id: str = "ml-a--nb",
           operation: Operation = Operation.EXECUTE, role: Role | None = Role.MEMBER,
           target: Target | None = RUNNING, now: datetime = NOW,
           policy: LinkPolicy = DEFAULT_POLICY) -> tuple[Outcome, Reason, int]:
    verdict = check_request(link, now=now, workspace_id=workspace_id, operation=operation,
                            creator_role=role, workspace=target, policy=policy)
    assert verdict.message or verdict.allowed
    return verdict.outcome, verdict.reason, verdict.status


def _state(state: str) -> Target:
    return dataclasses.replace(RUNNING, state=state)


DENY, ALLOW = Outcome.DENY, Outcome.ALLOW

#: case -> (arguments, expected (outcome, reason, HTTP status)); in ladder order.
CHECKS: dict[str, tuple[dict[str, object], tuple[Outcome, Reason, int]]] = {
    "ok": ({}, (ALLOW, Reason.OK, 200)),
    "read on an exec link": ({"operation": Operation.READ}, (ALLOW, Reason.OK, 200)),
    "unknown token": ({"link": None}, (DENY, Reason.UNKNOWN_LINK, 401)),
    "revoked": ({"link": dataclasses.replace(LINK, revoked_at=NOW, revoked_by="alice")},
                (DENY, Reason.REVOKED, 401)),
    "expired": ({"now": LINK.expires_at}, (DENY, Reason.EXPIRED, 401)),
    "revoked beats expired": ({"link": dataclasses.replace(LINK, revoked_at=NOW),
                               "now": LINK.expires_at}, (DENY, Reason.REVOKED, 401)),
    "another workspace": ({"workspace_id": "ml-b--other"}, (DENY, Reason.WRONG_WORKSPACE, 403)),
    "workspace gone": ({"target": None}, (DENY, Reason.WORKSPACE_GONE, 410)),
    "workspace deleted": ({"target": _state("DELETED")}, (DENY, Reason.WORKSPACE_GONE, 410)),
    "workspace of another team": ({"target": dataclasses.replace(RUNNING, team="ml-b")},
                                  (DENY, Reason.OTHER_TEAM, 403)),
    "creator removed from the team": ({"role": None}, (DENY, Reason.CREATOR_NOT_MEMBER, 403)),
    "creator demoted to viewer": ({"role": Role.VIEWER}, (DENY, Reason.CREATOR_NO_RIGHTS, 403)),
    "owner changed, creator a member": ({"target": dataclasses.replace(RUNNING, owner="carl")},
                                        (DENY, Reason.CREATOR_NO_RIGHTS, 403)),
    "owner changed, creator an admin": ({"target": dataclasses.replace(RUNNING, owner="carl"),
                                         "role": Role.ADMIN}, (ALLOW, Reason.OK, 200)),
    "read link executes": ({"link": dataclasses.replace(LINK, scope=Scope.READ)},
                           (DENY, Reason.SCOPE, 403)),
    "read link writes": ({"link": dataclasses.replace(LINK, scope=Scope.READ),
                          "operation": Operation.WRITE}, (DENY, Reason.SCOPE, 403)),
    "read link reads": ({"link": dataclasses.replace(LINK, scope=Scope.READ),
                         "operation": Operation.READ}, (ALLOW, Reason.OK, 200)),
    "paused: resume": ({"target": _state("PAUSED")}, (Outcome.RESUME, Reason.RESUMING, 202)),
    "paused, read link: no resume": ({"link": dataclasses.replace(LINK, scope=Scope.READ),
                                      "operation": Operation.READ, "target": _state("PAUSED")},
                                     (DENY, Reason.WORKSPACE_PAUSED, 409)),
    "resuming: wait": ({"target": _state("RESUMING")}, (Outcome.WAIT, Reason.WAITING, 202)),
    "pausing: wait": ({"target": _state("PAUSING")}, (Outcome.WAIT, Reason.WAITING, 202)),
    "provisioning: wait": ({"target": _state("PROVISIONING")},
                           (Outcome.WAIT, Reason.WAITING, 202)),
    # Waiting for capacity may take hours: refused at once, with a Retry-After.
    "queued for capacity": ({"target": _state("QUEUED")},
                            (DENY, Reason.WORKSPACE_QUEUED, 503)),
    "deleting": ({"target": _state("DELETING")}, (DENY, Reason.WORKSPACE_GONE, 410)),
    "failed": ({"target": _state("FAILED")}, (DENY, Reason.WORKSPACE_FAILED, 409)),
    # Sandboxes run beside the workspace: its state is no reason to wait, resume or refuse.
    "exec link requests a sandbox": ({"operation": Operation.SANDBOX}, (ALLOW, Reason.OK, 200)),
    "sandbox link requests a sandbox": ({"link": SANDBOX_LINK, "operation": Operation.SANDBOX},
                                        (ALLOW, Reason.OK, 200)),
    "sandbox, workspace paused: no resume": ({"link": SANDBOX_LINK, "target": _state("PAUSED"),
                                              "operation": Operation.SANDBOX},
                                             (ALLOW, Reason.OK, 200)),
    "sandbox, workspace failed": ({"operation": Operation.SANDBOX, "target": _state("FAILED")},
                                  (ALLOW, Reason.OK, 200)),
    "sandbox, workspace deleting": ({"operation": Operation.SANDBOX,
                                     "target": _state("DELETING")},
                                    (DENY, Reason.WORKSPACE_GONE, 410)),
    "sandbox, workspace deleted": ({"operation": Operation.SANDBOX, "target": _state("DELETED")},
                                   (DENY, Reason.WORKSPACE_GONE, 410)),
    "sandbox link executes": ({"link": SANDBOX_LINK}, (DENY, Reason.SCOPE, 403)),
    "sandbox link reads the API": ({"link": SANDBOX_LINK, "operation": Operation.READ},
                                   (DENY, Reason.SCOPE, 403)),
    "read link requests a sandbox": ({"link": dataclasses.replace(LINK, scope=Scope.READ),
                                      "operation": Operation.SANDBOX}, (DENY, Reason.SCOPE, 403)),
    "sandbox, revoked": ({"link": dataclasses.replace(SANDBOX_LINK, revoked_at=NOW),
                          "operation": Operation.SANDBOX}, (DENY, Reason.REVOKED, 401)),
    "sandbox, expired": ({"link": SANDBOX_LINK, "now": LINK.expires_at,
                          "operation": Operation.SANDBOX}, (DENY, Reason.EXPIRED, 401)),
    "sandbox, creator removed": ({"link": SANDBOX_LINK, "role": None,
                                  "operation": Operation.SANDBOX},
                                 (DENY, Reason.CREATOR_NOT_MEMBER, 403)),
    "sandbox, creator demoted to viewer": ({"link": SANDBOX_LINK, "role": Role.VIEWER,
                                            "operation": Operation.SANDBOX},
                                           (DENY, Reason.CREATOR_NO_RIGHTS, 403)),
}


@pytest.mark.parametrize("case", list(CHECKS))
def test_check_request(case: str) -> None:
    arguments, expected = CHECKS[case]
    assert _check(**arguments) == expected  # type: ignore[arg-type]


def test_every_reason_has_a_status() -> None:
    assert set(HTTP_STATUS) == set(Reason)


def test_the_revocation_promise_is_a_policy_invariant() -> None:
    assert DEFAULT_POLICY.cache_seconds + DEFAULT_POLICY.recheck_seconds < 1
    with pytest.raises(ValueError, match="one second"):
        LinkPolicy(cache_seconds=0.9, recheck_seconds=0.2)
    with pytest.raises(ValueError):
        LinkPolicy(default_ttl_seconds=10, min_ttl_seconds=60)


# --- operations -----------------------------------------------------------------------------------
@pytest.mark.parametrize("method, subpath, operation", [
    ("GET", "", Operation.READ),
    ("GET", "/", Operation.READ),
    ("POST", "", None),
    ("POST", "execute", Operation.EXECUTE),
    ("GET", "execute", None),
    ("GET", "api/contents/work.ipynb", Operation.READ),
    ("HEAD", "api/sessions", Operation.READ),
    ("PUT", "api/contents/x.py", Operation.WRITE),
    ("DELETE", "api/kernels/k1", Operation.WRITE),
    ("GET", "api/kernels/k1/channels", None),  # websockets go through /execute
    ("GET", "api/../../etc/passwd", None),
    ("GET", "lab", None),
    ("GET", "files/x", None),
    ("POST", "stasis/sandboxes", Operation.SANDBOX),
    ("POST", "stasis/sandboxes/", Operation.SANDBOX),
    ("GET", "stasis/sandboxes", Operation.SANDBOX),
    ("GET", "stasis/sandboxes/sbx-20250610-120000-abc123", Operation.SANDBOX),
    ("GET", "stasis/sandboxes/sbx-1/patch", Operation.SANDBOX),
    ("DELETE", "stasis/sandboxes/sbx-1", None),
    ("POST", "stasis/sandboxes/sbx-1", None),
    ("GET", "stasis/sandboxes/SBX_1", None),
    ("GET", "stasis/sandboxes/sbx-1/log", None),
    ("POST", "stasis/sandboxes/sbx-1/resume", Operation.SANDBOX),
    ("GET", "stasis/sandboxes/sbx-1/resume", None),
    ("POST", "stasis/sandboxes/sbx-1/patch", None),
    ("GET", "stasis/sandboxes/../../etc", None),
    ("GET", "stasis/other", None),
])
def test_operation_for(method: str, subpath: str, operation: Operation | None) -> None:
    assert operation_for(method, subpath) == operation


# --- creation and revocation ----------------------------------------------------------------------
def _create(**overrides: object) -> Issue | Refused:
    arguments: dict[str, object] = {
        "creator": "bob", "creator_role": Role.MEMBER, "workspace_id": "ml-a--nb",
        "workspace": RUNNING, "scope": "exec", "ttl_seconds": None, "active_links": 0,
        "now": NOW}
    arguments.update(overrides)
    return check_create(**arguments)  # type: ignore[arg-type]


def test_create_defaults_to_one_hour() -> None:
    assert _create() == Issue(NOW + timedelta(hours=1), 3600)


def test_a_long_ttl_is_capped_by_policy_with_a_notice() -> None:
    issue = _create(ttl_seconds=7 * 86400)
    assert isinstance(issue, Issue)
    assert issue.ttl_seconds == DEFAULT_POLICY.max_ttl_seconds
    assert issue.expires_at == NOW + timedelta(seconds=DEFAULT_POLICY.max_ttl_seconds)
    assert issue.notices == ("TTL 7d capped to 12h by policy",)


@pytest.mark.parametrize("overrides, reason, status", [
    ({"scope": "admin"}, Reason.BAD_SCOPE, 400),
    ({"workspace": None}, Reason.WORKSPACE_GONE, 410),
    ({"workspace": _state("DELETING")}, Reason.WORKSPACE_GONE, 410),
    ({"creator_role": None}, Reason.CREATOR_NOT_MEMBER, 403),  # e.g. another team's workspace
    ({"creator": "carl"}, Reason.CREATOR_NO_RIGHTS, 403),  # a member, not the owner
    ({"creator_role": Role.VIEWER}, Reason.CREATOR_NO_RIGHTS, 403),
    ({"workspace": _state("FAILED")}, Reason.WORKSPACE_FAILED, 409),
    ({"active_links": 20}, Reason.TOO_MANY_LINKS, 409),
    ({"ttl_seconds": 10}, Reason.BAD_TTL, 400),
])
def test_create_refusals(overrides: dict[str, object], reason: Reason, status: int) -> None:
    refused = _create(**overrides)
    assert isinstance(refused, Refused) and (refused.reason, refused.status) == (reason, status)


def test_a_viewer_may_create_a_read_link_to_their_own_workspace() -> None:
    assert isinstance(_create(creator_role=Role.VIEWER, scope="read"), Issue)


def test_a_paused_workspace_can_be_linked() -> None:
    assert isinstance(_create(workspace=_state("PAUSED")), Issue)


def test_revoke_by_creator_or_admin_only() -> None:
    revoked = check_revoke(LINK, actor="bob", actor_role=Role.MEMBER, now=NOW)
    assert isinstance(revoked, Link) and revoked.revoked_at == NOW and revoked.revoked_by == "bob"
    assert isinstance(check_revoke(LINK, actor="alice", actor_role=Role.ADMIN, now=NOW), Link)
    refused = check_revoke(LINK, actor="carl", actor_role=Role.MEMBER, now=NOW)
    assert isinstance(refused, Refused) and refused.reason == Reason.NOT_ALLOWED
    again = check_revoke(revoked, actor="bob", actor_role=Role.MEMBER, now=NOW)
    assert isinstance(again, Refused) and again.reason == Reason.ALREADY_REVOKED
    unknown = check_revoke(None, actor="bob", actor_role=Role.MEMBER, now=NOW)
    assert isinstance(unknown, Refused) and unknown.reason == Reason.UNKNOWN_LINK


def test_link_status() -> None:
    assert LINK.status(NOW) == "active"
    assert LINK.status(LINK.expires_at) == "expired"
    assert dataclasses.replace(LINK, revoked_at=NOW).status(NOW) == "revoked"


# --- rate arithmetic ------------------------------------------------------------------------------
def test_a_bucket_gives_its_burst_then_refills_at_the_rate() -> None:
    rate = Rate(per_second=2.0, burst=3)
    bucket = None
    results = []
    for _ in range(4):
        ok, bucket, retry = take(bucket, 10.0, rate)
        results.append((ok, round(retry, 3)))
    assert results == [(True, 0.0), (True, 0.0), (True, 0.0), (False, 0.5)]
    ok, bucket, _ = take(bucket, 10.5, rate)  # one token back after 0.5 s
    assert ok and available(bucket, 10.5, rate) == 0
    assert available(bucket, 100.0, rate) == 3  # never above the burst


def test_a_refused_take_does_not_dig_deeper() -> None:
    rate = Rate(per_second=1.0, burst=1)
    _, bucket, _ = take(None, 0.0, rate)
    for _ in range(10):
        ok, bucket, retry = take(bucket, 0.0, rate)
        assert not ok and retry == 1.0
    assert take(bucket, 1.0, rate)[0]


def test_rate_validation() -> None:
    with pytest.raises(ValueError):
        Rate(0, 1)
    assert Bucket(1.0, 0.0).tokens == 1.0


# --- the stored document --------------------------------------------------------------------------
def test_the_link_document_matches_its_schema_and_holds_no_token() -> None:
    from functions.adapters.link_store import link_from_doc, link_to_doc

    schema = json.loads((Path(__file__).resolve().parents[2] / "schemas" / "documents" /
                         "link.json").read_text())
    Draft202012Validator.check_schema(schema)
    doc = link_to_doc(dataclasses.replace(LINK, revoked_at=NOW, revoked_by="bob",
                                          revoke_reason="revoked"))
    as_json = {k: v.isoformat() if isinstance(v, datetime) else v for k, v in doc.items()}
    Draft202012Validator(schema, format_checker=FormatChecker()).validate(as_json)
    assert set(schema["required"]) == set(doc)
    assert link_from_doc(doc).revoked_by == "bob"
    assert TOKEN_PREFIX not in json.dumps(as_json)


def test_who_may_create_a_sandbox_link() -> None:
    # Owners (members) and team admins may; a viewer, who may not run sandboxes, may not.
    assert isinstance(_create(scope="sandbox"), Issue)
    assert isinstance(_create(scope="sandbox", creator="alice", creator_role=Role.ADMIN), Issue)
    refused = _create(scope="sandbox", creator_role=Role.VIEWER)
    assert isinstance(refused, Refused) and refused.reason == Reason.CREATOR_NO_RIGHTS
    assert "may create only read links" in refused.message


# -- one incarnation, one normal path (issue 18 §4) -------------------------------------------


def test_a_link_is_for_the_incarnation_it_was_made_for() -> None:
    link = dataclasses.replace(LINK, incarnation="inc-1")
    ours = dataclasses.replace(RUNNING, incarnation="inc-1")
    later = dataclasses.replace(RUNNING, owner="alice", version=9, incarnation="inc-2")

    def verdict(target: Target) -> Reason:
        return check_request(link, now=NOW, workspace_id="ml-a--nb",
                             operation=Operation.EXECUTE, creator_role=Role.ADMIN,
                             workspace=target).reason

    assert verdict(ours) == Reason.OK
    assert verdict(later) == Reason.WORKSPACE_GONE
    # A link made before incarnations does not reach a workspace created since.
    assert check_request(LINK, now=NOW, workspace_id="ml-a--nb", operation=Operation.EXECUTE,
                         creator_role=Role.ADMIN, workspace=later).reason == \
        Reason.WORKSPACE_GONE


@pytest.mark.parametrize(("raw", "normal"), [
    ("api/contents/x.py", "api/contents/x.py"),
    ("api//contents///x.py/", "api/contents/x.py"),
    ("", ""),
    ("api/contents/100% sure.txt", "api/contents/100% sure.txt"),
    ("api/%2e%2e/files/x", None),  # what %252e%252e is once decoded
    ("api/contents/%2Fetc", None),
    ("api/../files/x", None),
    ("api/./x", None),
    ("api/a\\b", None),
    ("api/a\x00b", None),
])
def test_the_normal_path(raw: str, normal: str | None) -> None:
    assert normal_path(raw) == normal


def test_who_may_change_a_workspace_is_the_rule_of_an_exec_link() -> None:
    """rights.change_refusal (chat, the portal) and links.rights (links, the IDE) are one
    rule: an owner who is only a viewer now, or who left the team, changes nothing."""
    from functions.domain.catalog import Member, Quotas, Team
    from functions.domain.rights import change_refusal

    team = Team("ml-a", "A", (Member("alice", Role.ADMIN), Member("bob", Role.MEMBER),
                              Member("vera", Role.VIEWER)), Quotas(1, 0, 0, 0), ())
    for user, owner, allowed in (("alice", "bob", True), ("bob", "bob", True),
                                 ("bob", "alice", False), ("vera", "vera", False),
                                 ("gone", "gone", False)):
        refusal = change_refusal(team, user, owner=owner, name="nb", verb="pause")
        assert (refusal is None) == allowed, (user, owner)
        role = team.member(user).role if team.member(user) else None
        assert (Scope.EXEC in rights(role, is_owner=owner == user)) == allowed
