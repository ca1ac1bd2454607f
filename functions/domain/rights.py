"""Who may see and change a workspace: a member of its team sees it; its owner (while a
member of the team with the member role) or an admin of its team changes it; a member
creates one in their team. Pure; the one wording of the refusal for every front door (chat,
the portal), and for the lifecycle handler, which checks a request from a person's front
door again (:func:`request_refusal`): a front door that is wrong, or forged, cannot act for
another team.

Changing a workspace is the rule of an ``exec`` link (:func:`functions.domain.links.rights`:
admins any of the team's workspaces, members their own, viewers none), so that the portal,
chat, links and the IDE agree on who may act on it: an owner who left the team, or was made
a viewer, neither links nor pauses nor deletes it any more.
"""

from __future__ import annotations

from functions.domain.catalog import Team
from functions.domain.links import Scope, rights


def may_see(team: Team | None, user: str) -> bool:
    """Members of the workspace's team see it (another team's workspace is not listed)."""
    return team is not None and team.member(user) is not None


def change_refusal(team: Team, user: str, *, owner: str, name: str, verb: str) -> str | None:
    """None if ``user`` may ``verb`` the workspace ``name`` of ``owner``, else why not."""
    member = team.member(user)
    if Scope.EXEC in rights(member.role if member else None, is_owner=owner == user):
        return None
    admins = ", ".join(team.admins) or "none"
    return (f"{name} belongs to {owner}; only they or an admin of team {team.id} "
            f"({admins}) can {verb} it.")


def request_refusal(team: Team | None, actor: str, *, team_id: str, owner: str | None,
                    name: str, verb: str) -> str | None:
    """None if ``actor`` may ``verb`` the workspace ``name`` of team ``team_id`` (``team``,
    None if the catalog has no such team): create one as a member (``owner`` None: a new
    workspace, for themselves), change one as its owner or an admin of its team."""
    if team is None or team.member(actor) is None:
        return f"{actor} is not a member of team {team_id}, so cannot {verb} {name}."
    if owner is None:
        return None
    return change_refusal(team, actor, owner=owner, name=name, verb=verb)
