"""The IDE in the browser: where a workspace's IDE is served, and who may open it. Pure.

Every workspace's whole IDE (JupyterLab or VS Code, HTTP and WebSocket) is served by the
IDE access proxy under one path, ``/w/<workspace id>/`` (``events.payloads.ide_path``: the
runtimes configure the IDE's server for it, so it is part of the contract); the workspace's
``url`` is that path on the proxy's public URL (:func:`ide_url`), while the direct address
and token of the IDE's server stay with the runtime, for the control plane only.

Who may open it is the links proxy's rule, not a copy of it (:mod:`functions.domain.links`):
a signed-in user reaches a workspace's IDE with the rights of an ``exec`` link they could
create on it (:func:`links.rights`: its owner, if a member of the team with the member or
admin role, or an admin of the team), and the workspace's state decides exactly as it does
for a link (:func:`links.state_verdict`): RUNNING passes, PAUSED may be resumed by the user
(the proxy shows a page with "Resume"), starting or pausing is waited for, deleting,
deleted or failed refuse. :func:`check_session` is checked on every request and every
WebSocket upgrade, and again while a WebSocket stays open.
"""

from __future__ import annotations

import re

from events.payloads import ide_path
from functions.domain.catalog import Role
from functions.domain.links import (
    Reason,
    Scope,
    Target,
    Verdict,
    deny,
    rights,
    state_verdict,
)

_PATH = re.compile(r"/w/(?P<id>[a-z][a-z0-9-]*--[a-z][a-z0-9-]*)(?P<rest>/.*)?")


def ide_url(proxy_url: str, workspace_id: str) -> str:
    """The workspace's ``url``: its IDE path on the proxy's public URL."""
    return proxy_url.rstrip("/") + ide_path(workspace_id)


def split_path(path: str) -> tuple[str, str] | None:
    """``/w/<id>/rest`` -> (id, ``/rest``); ``/w/<id>`` -> (id, ``""``); None for any other
    path (or a workspace id that cannot be one)."""
    match = _PATH.fullmatch(path)
    if match is None:
        return None
    return match.group("id"), match.group("rest") or ""


def sign_in_hint(portal_url: str | None) -> str:
    """What a browser without a session is told to do."""
    if portal_url:
        return f"sign in at {portal_url} (locally: `stasis portal`), then open this page again"
    return "sign in first (locally: `stasis portal` prints a sign-in link)"


def check_session(user: str, *, role: Role | None, workspace: Target | None,
                  workspace_id: str) -> Verdict:
    """Whether signed-in ``user`` (whose role in the workspace's team is ``role``, None if
    they are not a member) may use the IDE of ``workspace_id`` now."""
    if workspace is None or workspace.state == "DELETED":
        return deny(Reason.WORKSPACE_GONE, f"workspace {workspace_id} does not exist")
    if role is None:
        # Not listed, not explained: another team's workspace is not theirs to know about.
        return deny(Reason.NOT_MEMBER, f"{user} is not a member of team {workspace.team}")
    if Scope.EXEC not in rights(role, is_owner=workspace.owner == user):
        return deny(Reason.NO_RIGHTS, f"{workspace_id} belongs to {workspace.owner}: only "
                    f"they and the admins of team {workspace.team} open its IDE")
    return state_verdict(workspace, resumes=True)


def resume_requestid(workspace: Target) -> str:
    """One resume request per paused period (the version moves on every transition): a
    double click, a refresh or two tabs ask the lifecycle once."""
    return f"ide-resume-{workspace.id}-v{workspace.version}"
