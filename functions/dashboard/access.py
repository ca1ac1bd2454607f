"""Who may read the dashboard: the identity of a request and the admin rule. Pure.

Identity, decided by the environment (read per request, so a test or an operator can change
it without a restart), failing closed:

- ``STASIS_IAP_AUDIENCE`` set (or ``STASIS_IDENTITY=iap``): a deployment behind
  Identity-Aware Proxy. Every request must carry a valid IAP JWT (header
  ``x-goog-iap-jwt-assertion``) for that audience (``/projects/NUMBER/global/
  backendServices/ID`` or ``/projects/NUMBER/apps/PROJECT``), verified by
  ``functions/adapters/iap.py`` (google-auth ``id_token.verify_token`` with IAP's keys and
  issuer); its ``email`` claim is the identity. Headers such as
  ``x-goog-authenticated-user-email`` are never trusted on their own.
- otherwise ``STASIS_IDENTITY=dev``, or the local stack (``FIRESTORE_EMULATOR_HOST`` set,
  as ``stasis up`` does): an explicit dev identity, ``STASIS_DASHBOARD_DEV_USER`` (default
  ``dev``, an admin of ml-a in examples/stasis.yaml). No request header can change it.
- otherwise: every request is refused with a message naming the variable to set.

The admin rule: a user is an admin if they are in ``STASIS_PLATFORM_ADMINS`` (a comma
separated list of users or e-mail addresses; Terraform sets it from ``platform_admins``) or
have the role ``admin`` in a team of the applied catalog. A platform admin sees every team;
a team admin sees only the teams they are an admin of (:attr:`Verdict.teams`), on every
page: another team's fleet, snapshots, costs, links, sandboxes and audit entries are not
read at all, and asking for one by name is refused (403).

An IAP e-mail maps to a Stasis user by itself (members may be listed by e-mail) or, with
``STASIS_DASHBOARD_EMAIL_DOMAIN=example.com``, ``alice@example.com`` to ``alice``; a
look-alike address in another domain never maps to a short user name.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from enum import StrEnum

#: Google's keys for IAP JWTs (``{key id: PEM}``), as documented for IAP.
IAP_CERTS_URL = "https://www.gstatic.com/iap/verify/public_key"
DEFAULT_DEV_USER = "dev"


class Mode(StrEnum):
    IAP = "iap"
    DEV = "dev"
    UNCONFIGURED = "unconfigured"


@dataclass(frozen=True)
class AccessConfig:
    mode: Mode
    audience: str | None = None
    certs_url: str = IAP_CERTS_URL
    dev_user: str = DEFAULT_DEV_USER
    platform_admins: frozenset[str] = frozenset()
    email_domain: str | None = None


def access_config(environ: Mapping[str, str]) -> AccessConfig:
    """The identity mode and admin list from the environment (see the module docstring)."""
    admins = frozenset(a.strip() for a in environ.get("STASIS_PLATFORM_ADMINS", "").split(",")
                       if a.strip())
    domain = environ.get("STASIS_DASHBOARD_EMAIL_DOMAIN", "").strip().lstrip("@") or None
    audience = environ.get("STASIS_IAP_AUDIENCE", "").strip()
    chosen = environ.get("STASIS_IDENTITY", "").strip().lower()
    if audience or chosen == Mode.IAP:
        # An IAP mode without an audience stays closed (verify() has nothing to check).
        return AccessConfig(Mode.IAP if audience else Mode.UNCONFIGURED, audience=audience or None,
                            certs_url=environ.get("STASIS_IAP_CERTS_URL") or IAP_CERTS_URL,
                            platform_admins=admins, email_domain=domain)
    if chosen == Mode.DEV or (not chosen and environ.get("FIRESTORE_EMULATOR_HOST")):
        return AccessConfig(Mode.DEV,
                            dev_user=environ.get("STASIS_DASHBOARD_DEV_USER", "").strip()
                            or DEFAULT_DEV_USER,
                            platform_admins=admins, email_domain=domain)
    return AccessConfig(Mode.UNCONFIGURED, platform_admins=admins, email_domain=domain)


UNCONFIGURED_MESSAGE = ("the dashboard has no identity source: set STASIS_IAP_AUDIENCE behind "
                        "Identity-Aware Proxy, or STASIS_IDENTITY=dev on a local stack")


def user_for_email(email: str, domain: str | None) -> str:
    """The Stasis user an IAP e-mail acts as: the local part within ``domain``, else the
    whole address."""
    email = email.strip().lower()
    local, at, host = email.rpartition("@")
    if at and domain and host == domain.lower():
        return local
    return email


@dataclass(frozen=True)
class Verdict:
    allowed: bool
    user: str | None
    why: str
    #: The teams the user may see: None for every team (a platform admin).
    teams: frozenset[str] | None = frozenset()


def decide(user: str | None, *, email: str | None, config: AccessConfig,
           catalog: Mapping[str, object] | None) -> Verdict:
    """Whether ``user`` (None: no identity) may read the dashboard, and which teams.

    ``catalog`` is the applied catalog document (its ``teams``, each with ``members``
    entries ``{"user", "role"}``).
    """
    if user is None:
        return Verdict(False, None, "no identity")
    names = {user} | ({email.strip().lower()} if email else set())
    if names & config.platform_admins:
        return Verdict(True, user, "platform admin (STASIS_PLATFORM_ADMINS): every team",
                       None)
    admin_of = frozenset(team_id for team_id, members in _teams(catalog)
                         if any(m.get("user") in names and m.get("role") == "admin"
                                for m in members))
    if admin_of:
        return Verdict(True, user, "team admin in the catalog of "
                       + ", ".join(sorted(admin_of)), admin_of)
    return Verdict(False, user, f"{user} is not an admin: the dashboard is for team admins "
                                "(role admin in the catalog) and platform admins "
                                "(STASIS_PLATFORM_ADMINS)")


def _teams(catalog: Mapping[str, object] | None
           ) -> Iterable[tuple[str, list[Mapping[str, object]]]]:
    """(team id, member entries) of every team of an applied catalog document."""
    teams = (catalog or {}).get("teams")
    for team in teams if isinstance(teams, list) else []:
        if not isinstance(team, Mapping) or "id" not in team:
            continue
        members = team.get("members")
        yield str(team["id"]), [m for m in (members if isinstance(members, list) else [])
                                if isinstance(m, Mapping)]
