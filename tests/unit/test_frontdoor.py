"""The front doors' preview (``functions.domain.frontdoor``): the findings of issue 24 refused
at once in the domain's words, and the three doors -- the CLI's ``cli`` function, chat's
``/ws``, the portal's form -- saying the same words and publishing nothing for them."""

from __future__ import annotations

import re
from typing import Any

import pytest
import yaml
from chat_fakes import CATALOG, ROOT, chat_deps, workspace
from link_fakes import Clock, RecordingBus
from portal_fakes import MemoryPortalStore, portal_app
from test_portal import NOW, Portal
from werkzeug.test import Client

from events import WorkspacePauseRequested, WorkspaceRequested, WorkspaceResumeRequested
from functions.adapters.null_runtime import NullRuntime
from functions.chatops.ports import SlashRequest
from functions.chatops.service import answer
from functions.domain import admission, frontdoor
from functions.domain.catalog import Catalog
from functions.domain.frontdoor import Door
from functions.domain.lifecycle import State, decide
from functions.portal import api
from functions.portal.ports import PortalDeps
from functions.ports import ledger_key

CAPS = NullRuntime(RecordingBus()).capabilities()
ML_A = CATALOG.teams["ml-a"]


def _none() -> list[Any]:
    return []


#: The five commands of the issue, tried as alice (a member of ml-a only), and what the domain
#: answers each with.
FINDINGS = {
    "bad name": (["create", "My_NB", "--team", "ml-a"],
                 frontdoor.name_refusal("My_NB")),
    "no such team": (["create", "nb", "--team", "ml-z"],
                     frontdoor.choose_team(CATALOG, "alice", "ml-z")),
    "no such profile": (["create", "nb", "--team", "ml-a", "--profile", "gpu-huge"],
                        frontdoor.preview_create(CATALOG, WorkspaceRequested(
                            team="ml-a", owner="alice", name="nb", profile="gpu-huge"),
                            None, {}, CAPS, NOW).refusal),
    "not her team": (["create", "nb", "--team", "ml-b"],
                     frontdoor.choose_team(CATALOG, "alice", "ml-b")),
    "no such workspace": (["pause", "nothere"],
                          frontdoor.find_workspace(ML_A, "nothere", None, _none)),
}


def test_each_finding_is_refused_with_what_to_do_next() -> None:
    said = {case: text for case, (_, text) in FINDINGS.items()}
    assert said["bad name"] == ("Name `My_NB` is not valid: use a-z, 0-9 and single dashes, "
                                "start with a letter, do not end with a dash. Try `my-nb`.")
    assert said["no such team"] == "There is no team ml-z. Did you mean ml-a? Your teams: ml-a."
    assert said["no such profile"] == ("There is no profile gpu-huge. Profiles for team ml-a: "
                                       f"{', '.join(ML_A.profiles)}.")
    assert said["not her team"] == (
        "You are not a member of team ml-b, so you cannot see or change its workspaces; ask "
        f"{CATALOG.teams['ml-b'].who_to_ask} to add you. Your teams: ml-a.")
    assert said["no such workspace"] == ("There is no workspace nothere in team ml-a. See "
                                         "`stasis ws list`.")


def test_each_door_frames_the_same_words() -> None:
    text = "There is no workspace nothere in team ml-a. See `stasis ws list`."
    assert frontdoor.refused(text, Door.CLI) == (
        "Nothing done: there is no workspace nothere in team ml-a. See `stasis ws list`.")
    assert frontdoor.refused(text, Door.CHAT) == (
        "Nothing done: there is no workspace nothere in team ml-a. See `/ws list`.")
    assert frontdoor.refused(text, Door.PORTAL) == text
    # An acronym or a name keeps its case after "Nothing done: ".
    assert frontdoor.refused("GPU quota is full.", Door.CLI) == "Nothing done: GPU quota is full."


# --- the three doors ---------------------------------------------------------------------------
class CliFunction:
    """The ``cli`` function over memory, called as the CLI calls it."""

    def __init__(self, *workspaces: Any, usage: dict[str, Any] | None = None) -> None:
        self.bus = RecordingBus()
        self.store = MemoryPortalStore()
        for ws in workspaces:
            self.store.put(ws)
        if usage is not None:
            self.store.docs["teams"] = {"ml-a": {"usage": usage}}
        env = {"STASIS_IDENTITY": "dev"}
        deps = PortalDeps(store=self.store, bus=self.bus, runtime=NullRuntime(self.bus),
                          catalog=lambda: CATALOG, clock=Clock(NOW), links=lambda: None,
                          iap=lambda a, c: None, environ=lambda: env)  # type: ignore[arg-type, return-value]
        self.client = Client(portal_app(deps, api.serve))

    def request(self, argv: list[str], user: str | None = "alice") -> tuple[int, dict[str, Any]]:
        verb, name, *rest = argv
        body: dict[str, Any] = {"verb": verb, "name": name, "requestid": "r-" + verb,
                                **dict(zip([f.lstrip("-") for f in rest[::2]], rest[1::2],
                                           strict=True))}
        headers = {"X-Stasis-User": user} if user else {}
        got = self.client.post("/", json=body, headers=headers)
        return got.status_code, got.get_json()


def _chat(deps: Any, argv: list[str]) -> str:
    reply = answer(SlashRequest(text=" ".join(argv), user="U0ALICE", requestid="slack-r1",
                                team="T0", channel="C0", response_url="https://hooks.test/r"),
                   deps)
    return str(reply["text"])


def _portal(argv: list[str]) -> tuple[Portal, str | None]:
    """The portal's new-workspace form posted as alice with the command's fields."""
    _, name, *rest = argv
    flags = dict(zip([f.lstrip("-") for f in rest[::2]], rest[1::2], strict=True))
    portal = Portal(CATALOG)
    portal.sign_in("alice")
    fields = {"csrf": portal.csrf("/new"), "team": flags.get("team", "ml-a"), "name": name,
              "ide": "jupyterlab", "environment": "python-3-11",
              "profile": flags.get("profile", "cpu-small")}
    got = portal.client.post("/workspaces", data=fields)
    shown = re.search(r'data-testid="refusal">(.*?)</div>', got.get_data(as_text=True))
    assert got.status_code == 400
    return portal, (re.sub(r"</?code>", "`", shown.group(1)).replace("&#39;", "'")
                    if shown else None)


@pytest.mark.parametrize("case", sorted(FINDINGS))
def test_the_cli_chat_and_the_portal_say_the_same_and_publish_nothing(case: str) -> None:
    argv, said = FINDINGS[case]
    assert isinstance(said, str)
    cli = CliFunction()
    status, body = cli.request(argv)
    assert (status, body) == (400, {"refusal": frontdoor.refused(said, Door.CLI)})
    assert cli.bus.events == []

    deps = chat_deps()
    text = _chat(deps, argv)
    if case == "bad name":  # chat's grammar says it, with the command's usage
        assert frontdoor.check_name("My_NB") in text and text.startswith("name `My_NB`")
    else:
        assert text.startswith(frontdoor.refused(said, Door.CHAT) + "\n_request ")
    assert deps.bus.published == []  # type: ignore[attr-defined]

    if argv[0] == "create":  # the portal names no workspace it does not list
        portal, shown = _portal(argv)
        assert shown == frontdoor.refused(said, Door.PORTAL)
        assert portal.bus.events == []


def test_a_state_and_a_quota_are_refused_alike_by_the_cli_and_chat() -> None:
    paused = workspace("nb", state=State.PAUSED)
    cli = CliFunction(paused)
    status, body = cli.request(["pause", "nb"])
    expected = frontdoor.preview_transition(CATALOG, paused, WorkspacePauseRequested(
        workspace_id=paused.id, actor="alice"), {}, NOW).refusal
    assert expected == "nb is PAUSED: already paused."
    assert (status, body["refusal"]) == (400, frontdoor.refused(expected, Door.CLI))
    assert _chat(chat_deps(paused), ["pause", "nb"]).startswith(
        frontdoor.refused(expected, Door.CHAT))

    full = {"workspaces": ML_A.quotas.workspaces, "gpus": 0, "tpus": 0, "snapshot_bytes": 0}
    cli = CliFunction(usage=full)
    status, body = cli.request(["create", "nb"])
    new = decide(None, WorkspaceRequested(team="ml-a", owner="alice", name="nb",
                                          profile="cpu-small"), NOW).workspace
    assert new is not None
    refusal, _ = admission.preview(CATALOG, None, None, new, full)
    assert refusal and refusal.startswith("team ml-a has 10/10 workspaces")
    assert (status, body["refusal"]) == (400, f"Nothing done: {refusal}.")
    assert cli.bus.events == []


def test_what_passes_is_published_once_as_the_clis_request() -> None:
    cli = CliFunction()
    status, body = cli.request(["create", "nb"])
    assert status == 202, body
    (event,) = cli.bus.events
    assert (event.source, event.requestid, event.id, event.subject) == (
        "//stasis/cli", "r-create", "r-create", "ml-a--nb")
    assert event.payload.profile == ML_A.profiles[0] and event.payload.owner == "alice"
    assert body == {"id": "r-create", "type": event.type, "name": "workspace.requested",
                    "requestid": "r-create", "workspace_id": "ml-a--nb", "team": "ml-a",
                    "verdict": ledger_key("on_workspace_requested", event),
                    "queued": None, "notices": []}


def test_a_resume_the_gpu_quota_holds_is_published_and_says_it_will_wait() -> None:
    paused = workspace("nb", state=State.PAUSED, current_snapshot="ml-a--nb-1")
    held = {"workspaces": 1, "gpus": ML_A.quotas.gpus, "tpus": 0, "snapshot_bytes": 0}
    cli = CliFunction(paused, usage=held)
    status, body = cli.request(["resume", "nb", "--profile", "gpu-small"])
    expected = frontdoor.preview_resume(CATALOG, paused, WorkspaceResumeRequested(
        workspace_id=paused.id, actor="alice", profile="gpu-small"), held, NOW)
    assert expected.refusal is None and expected.queued
    assert status == 202 and body["queued"] == expected.queued
    assert len(cli.bus.events) == 1


def test_a_name_that_is_no_slug_names_no_workspace() -> None:
    cli = CliFunction()
    status, body = cli.request(["pause", "a/b"])
    assert (status, body["refusal"]) == (400, "Nothing done: there is no workspace a/b in team "
                                              "ml-a. See `stasis ws list`.")


def test_who_is_asking_must_be_said() -> None:
    cli = CliFunction()
    status, body = cli.request(["create", "nb"], user=None)
    assert status == 401 and "X-Stasis-User" in body["refusal"]
    assert cli.bus.events == []


def test_the_listing_holds_only_the_callers_teams() -> None:
    cli = CliFunction(workspace("mine"), workspace("theirs", team="ml-b", owner="carol"))
    got = cli.client.get("/workspaces", headers={"X-Stasis-User": "alice"}).get_json()
    assert [(r["team"], r["name"]) for r in got["workspaces"]] == [("ml-a", "mine")]
    refused = cli.client.get("/workspaces?team=ml-b", headers={"X-Stasis-User": "alice"})
    assert refused.status_code == 400
    assert refused.get_json()["refusal"].startswith("You are not a member of team ml-b")


def test_a_bus_that_fails_is_unavailable_and_nothing_was_changed() -> None:
    cli = CliFunction()
    cli.bus.fail = True
    status, body = cli.request(["create", "nb"])
    assert status == 503 and "nothing was changed" in body["refusal"]



def test_a_gpu_declared_for_the_node_passes_the_preview_as_it_passes_the_handler() -> None:
    config = yaml.safe_load((ROOT / "examples" / "stasis.yaml").read_text())
    config["scheduling"] = {"nodes": [{"id": "node-1", "accelerators": {"nvidia-l4": 1}}]}
    declared = Catalog.from_config(config)
    caps = {**CAPS, "node": "node-1", "accelerators": {}}
    request = WorkspaceRequested(team="ml-a", owner="alice", name="nb", profile="gpu-small")
    assert frontdoor.preview_create(declared, request, None, {}, caps, NOW).refusal is None
    # Without the declaration this host has no GPU: refused, as the handler would.
    refused = frontdoor.preview_create(CATALOG, request, None, {}, caps, NOW).refusal
    assert refused and "this host has no GPU" in refused
