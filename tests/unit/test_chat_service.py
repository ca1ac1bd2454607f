"""The /ws command against fakes: identity, team isolation, the lifecycle preview, the event
it publishes; the bolt app in front of it (signatures, retries, any text gets a reply)."""

from __future__ import annotations

import dataclasses
import time
import urllib.parse
from datetime import timedelta
from typing import Any

import pytest
import yaml
from chat_fakes import CATALOG, NOW, ROOT, FakeBus, FakeStore, chat_deps, workspace
from hypothesis import given, settings
from hypothesis import strategies as st

from events import (
    SandboxRequested,
    WorkspaceDeleteRequested,
    WorkspacePauseRequested,
    WorkspaceRequested,
)
from functions.adapters.slack import ChatFunction, SlackSettings
from functions.chatops import signing
from functions.chatops.ports import ChatDeps, SlashRequest
from functions.chatops.replies import ReplyTarget
from functions.chatops.service import answer, sandbox_id_for
from functions.domain.catalog import Catalog
from functions.domain.lifecycle import State

URL = "https://hooks.slack.com/commands/T0/1/abc"


def ask(deps: ChatDeps, text: str, user: str = "U0ALICE", *, retry: bool = False,
        requestid: str = "slack-r1") -> str:
    reply = answer(SlashRequest(text=text, user=user, requestid=requestid, team="T0",
                                channel="C0", response_url=URL, retry=retry), deps)
    assert reply["response_type"] == "ephemeral"
    assert f"`{requestid}`" in reply["text"]  # every ack names the request
    return str(reply["text"])


def published(deps: ChatDeps) -> list[Any]:
    return deps.bus.published  # type: ignore[attr-defined, no-any-return]


# -- identity and isolation ----------------------------------------------------------------

def test_an_unknown_slack_user_is_told_whom_to_ask() -> None:
    deps = chat_deps()
    text = ask(deps, "create mynb", user="U0NOBODY")
    assert "I don't know you yet" in text and "`slack_user_id: U0NOBODY`" in text
    assert "alice, or #ml-a-infra on Slack (team ml-a)" in text and "carol (team ml-b)" in text
    assert published(deps) == []


def test_a_slack_user_mapped_since_the_cache_was_read_is_known() -> None:
    # Chat's instance holds the catalog read before the admin mapped U0DANA (re-read every
    # 10 s): the reply is not "I don't know you yet", and the create is published.
    config = yaml.safe_load((ROOT / "examples" / "stasis.yaml").read_text())
    next(t for t in config["teams"] if t["id"] == "ml-b")["members"].append(
        {"user": "dana", "role": "member", "slack_user_id": "U0DANA"})
    applied = Catalog.from_config(config)
    stale = chat_deps()
    assert "I don't know you yet" in ask(stale, "create mynb", user="U0DANA")
    deps = dataclasses.replace(chat_deps(), refresh_catalog=lambda: applied)
    text = ask(deps, "create mynb", user="U0DANA")
    assert "I don't know you yet" not in text
    [event] = published(deps)
    assert (event.payload.owner, event.payload.team) == ("dana", "ml-b")


def test_help_needs_no_identity() -> None:
    assert "`/ws <command>`" in ask(chat_deps(), "help", user="U0NOBODY")
    assert "`/ws pause NAME" in ask(chat_deps(), "pause --help", user="U0NOBODY")


def test_a_member_of_another_team_cannot_see_or_act() -> None:
    deps = chat_deps(workspace("mynb"))
    for text in ("status mynb --team ml-a", "pause mynb --team ml-a", "list --team ml-a"):
        reply = ask(deps, text, user="U0CAROL")
        assert "you are not a member of team ml-a" in reply.lower() and "ask alice" in reply
    # Without --team, names resolve in carol's own team: ml-a's workspace does not exist there.
    assert "Nothing done: there is no workspace mynb in team ml-b" in ask(deps, "pause mynb",
                                                                         user="U0CAROL")
    assert "no workspaces" in ask(deps, "list", user="U0CAROL")
    assert published(deps) == []


def test_an_unknown_team_gets_a_suggestion() -> None:
    assert "There is no team ml-c. Did you mean ml-a?" in ask(chat_deps(), "list --team ml-c")


def test_only_the_owner_or_a_team_admin_changes_a_workspace() -> None:
    deps = chat_deps(workspace("alices", owner="alice"), workspace("bobs", owner="bob"))
    refused = ask(deps, "pause alices", user="U0BOB")
    assert "alices belongs to alice; only they or an admin of team ml-a (alice, dev)" in refused
    assert "Pausing bobs" in ask(deps, "pause bobs", user="U0BOB")
    assert "Pausing bobs" in ask(deps, "pause bobs", user="U0ALICE", requestid="slack-r2")
    assert [e.payload.actor for e in published(deps)] == ["bob", "alice"]
    assert "mynb" not in ask(deps, "status alices", user="U0BOB")  # members may look


# -- changes: preview, record, event -----------------------------------------------------------

def test_create_publishes_the_request_with_where_to_reply() -> None:
    deps = chat_deps()
    text = ask(deps, "create mynb --profile cpu-large --env python-3-10")
    assert "Creating mynb for team ml-a: cpu-large, jupyterlab, python-3-10" in text
    assert "Note: python-3-10 is deprecated" in text
    [event] = published(deps)
    assert event.payload == WorkspaceRequested(
        team="ml-a", owner="alice", name="mynb", profile="cpu-large", ide="jupyterlab",
        environment="python-3-10", reply_to=event.payload.reply_to)
    assert (event.id, event.requestid, event.source) == ("slack-r1", "slack-r1", "//stasis/chat")
    assert ReplyTarget.decode(event.payload.reply_to) == ReplyTarget("U0ALICE", "C0", "T0", URL,
                                                                     NOW)
    record = deps.records.recall("slack-r1")
    assert record is not None and record["response_url"] == URL
    assert (record["user"], record["workspace_id"], record["response_url_uses"]) == (
        "alice", "ml-a--mynb", 0)


def test_create_without_a_profile_takes_the_teams_first_and_says_so() -> None:
    deps = chat_deps()
    assert "cpu-small (the team's default; `--profile` picks another)" in ask(deps, "create nb")
    assert published(deps)[0].payload.profile == "cpu-small"


@pytest.mark.parametrize(("text", "user", "says"), [
    ("create mynb --profile cpu-smal", "U0ALICE", "Nothing done: there is no profile cpu-smal. "
                                                  "Did you mean cpu-small or gpu-small?"),
    ("create mynb --profile tpu-v5e-8", "U0CAROL", "Nothing done: profile tpu-v5e-8 is not "
                                                   "available to team ml-b; ask carol"),
    ("create mynb --env python-3-12", "U0ALICE", "Nothing done: there is no environment "
                                                 "python-3-12"),
    ("create mynb --env legacy-tf1", "U0ALICE", "no longer offered"),
    ("create mynb --ide emacs", "U0ALICE", "Nothing done: there is no IDE emacs"),
    ("resume mynb --profile gpu-huge", "U0ALICE", "Nothing done: there is no profile gpu-huge"),
])
def test_catalog_refusals_are_answered_at_once(text: str, user: str, says: str) -> None:
    deps = chat_deps(workspace("mynb", state=State.PAUSED, current_snapshot="s1"))
    assert says in ask(deps, text, user=user)
    assert published(deps) == []


@pytest.mark.parametrize(("text", "state", "says"), [
    ("create mynb", State.RUNNING, "Nothing done: mynb is RUNNING: workspace mynb already "
                                   "exists (RUNNING); pick another name."),
    ("pause mynb", State.PAUSED, "Nothing done: mynb is PAUSED: already paused."),
    ("pause mynb", State.PROVISIONING, "cannot pause while PROVISIONING; wait until RUNNING"),
    ("resume mynb", State.RUNNING, "Nothing done: mynb is RUNNING: already running."),
    ("delete mynb", State.DELETED, "Nothing done: there is no workspace mynb in team ml-a. "
                                   "See `/ws list`."),
    ("status mynb", State.DELETED, "There is no workspace mynb in team ml-a"),
])
def test_the_lifecycle_preview_answers_what_would_be_refused(text: str, state: State,
                                                              says: str) -> None:
    deps = chat_deps(workspace("mynb", state=state))
    assert says in ask(deps, text)
    assert published(deps) == []


@pytest.mark.parametrize(("text", "usage", "says"), [
    ("create big --profile cpu-small", {"workspaces": 4},
     "Nothing done: team ml-b has 4/4 workspaces (paused ones count too)"),
])
def test_what_the_quota_will_refuse_is_answered_at_once(text: str, usage: dict[str, int],
                                                        says: str) -> None:
    deps = chat_deps(workspace("paused", team="ml-b", owner="carol", state=State.PAUSED,
                               current_snapshot="s1", profile_="gpu-small"))
    deps.reads.docs[("teams", "ml-b")] = {"usage": usage}  # type: ignore[attr-defined]
    assert says in ask(deps, text, user="U0CAROL")
    assert published(deps) == []
    deps.reads.docs[("teams", "ml-b")] = {"usage": {}}  # type: ignore[attr-defined]
    assert "Nothing done" not in ask(deps, text, user="U0CAROL")
    assert len(published(deps)) == 1


@pytest.mark.parametrize(("text", "usage"), [
    ("create big --profile gpu-small", {"gpus": 1}),
    ("resume paused", {"gpus": 1, "workspaces": 2}),
])
def test_what_the_gpu_quota_makes_wait_is_published_and_said_to_wait(
        text: str, usage: dict[str, int]) -> None:
    deps = chat_deps(workspace("paused", team="ml-b", owner="carol", state=State.PAUSED,
                               current_snapshot="s1", profile_="gpu-small"))
    deps.reads.docs[("teams", "ml-b")] = {"usage": usage}  # type: ignore[attr-defined]
    answer = ask(deps, text, user="U0CAROL")
    assert "It will wait in the queue: team ml-b uses 1/1 GPUs: pause or delete one, see " \
           "`/ws list`. I'll tell you when it starts." in answer
    assert len(published(deps)) == 1


def test_a_typo_in_a_workspace_name_gets_a_suggestion() -> None:
    deps = chat_deps(workspace("llm-finetune"))
    assert "Did you mean llm-finetune?" in ask(deps, "pause llm-finetun")


def test_pause_and_delete_publish_their_events() -> None:
    deps = chat_deps(workspace("mynb"))
    assert "Pausing mynb" in ask(deps, "pause mynb")
    assert "Its home directory is kept" in ask(deps, "delete mynb --keep-home",
                                               requestid="slack-r2")
    assert [e.payload for e in published(deps)] == [
        WorkspacePauseRequested(workspace_id="ml-a--mynb", actor="alice"),
        WorkspaceDeleteRequested(workspace_id="ml-a--mynb", actor="alice", keep_home=True)]


def test_a_slack_retry_is_published_again_with_the_same_ids_for_the_ledger() -> None:
    deps = chat_deps()
    first = ask(deps, "create mynb")
    # The first attempt's effect is visible by the time the retry comes: no preview then.
    deps.reads.workspaces["ml-a--mynb"] = workspace("mynb",  # type: ignore[attr-defined]
                                                    state=State.PROVISIONING)
    again = ask(deps, "create mynb", retry=True)
    assert first == again
    a, b = published(deps)
    assert (a.id, a.requestid, a.payload) == (b.id, b.requestid, b.payload)
    assert len(deps.records.records) == 1  # type: ignore[attr-defined]


def test_a_failed_publish_says_nothing_was_changed() -> None:
    deps = chat_deps(bus=FakeBus(fail=True))
    assert "I could not queue that (ConnectionError); nothing was changed" in ask(deps,
                                                                                  "create nb")


def test_an_internal_error_still_gets_an_answer() -> None:
    deps = chat_deps()

    def broken() -> Any:
        raise RuntimeError("firestore down")

    deps.catalog = broken
    assert "Something went wrong on our side (RuntimeError)" in ask(deps, "list")


# -- reads ---------------------------------------------------------------------------------

def test_list_status_snapshots_catalog_quota() -> None:
    ws = workspace("mynb", state=State.PAUSED, current_snapshot="ml-a--mynb-v4",
                   last_pause_ms=3400)
    deps = chat_deps(ws, workspace("other", team="ml-b", owner="carol"))
    store: FakeStore = deps.reads  # type: ignore[assignment]
    store.docs[("snapshots", "ml-a--mynb-v4")] = {"workspace": "ml-a--mynb", "bytes": 2**30,
                                                  "status": "ready", "duration_ms": 3000}
    store.docs[("teams", "ml-a")] = {"usage": {"workspaces": 1, "gpus": 0, "tpus": 0,
                                               "snapshot_bytes": 2**30}}
    listing = ask(deps, "list")
    assert "`mynb`  PAUSED  cpu-small  (alice)" in listing and "other" not in listing
    status = ask(deps, "status mynb")
    assert "*PAUSED*" in status and "last pause 3.4 s" in status and "(1 GiB)" in status
    assert "`ml-a--mynb-v4`  ready  1 GiB  in 3 s" in ask(deps, "snapshots mynb")
    catalog = ask(deps, "catalog")
    assert "`gpu-small`  One NVIDIA L4 (4 CPUs, 16 GiB, Spot), 1 x nvidia-l4, $0.70/h" in catalog
    assert "`python-3-9`" not in catalog  # hidden environments are not offered
    assert "`tpu-v5e-8`" not in ask(deps, "catalog", user="U0CAROL")
    quota = ask(deps, "quota")
    assert "workspaces 1/10" in quota and "snapshots 1 GiB/50 GiB" in quota
    assert "not available on this deployment yet" in ask(deps, "link mynb")


# -- the bolt app in front -------------------------------------------------------------------

SECRET = "test-signing-secret"


def _app(deps: ChatDeps | None = None) -> tuple[ChatFunction, ChatDeps]:
    deps = deps or chat_deps()
    return ChatFunction(SlackSettings(SECRET, "xoxb-test", "http://127.0.0.1:9/api/",
                                      team_id="T0"),
                        lambda req: answer(req, deps)), deps


def _body(text: str, user: str = "U0ALICE", trigger: str = "1.2.abc", team: str = "T0",
          **more: str) -> str:
    return urllib.parse.urlencode({"command": "/ws", "text": text, "user_id": user,
                                   "team_id": team, "channel_id": "C0", "response_url": URL,
                                   "trigger_id": trigger, **more})


def _headers(body: str, *, ts: int | None = None, secret: str = SECRET,
             retry: int | None = None) -> dict[str, str]:
    headers = signing.signed_headers(secret, ts or int(time.time()), body)
    if retry is not None:
        headers[signing.RETRY_HEADER] = str(retry)
    return headers


def test_a_signed_command_is_acked_with_its_request_id() -> None:
    app, deps = _app()
    body = _body("create mynb --profile cpu-small")
    response = app.dispatch(body, _headers(body))
    assert response.status == 200
    requestid = signing.request_id("1.2.abc", body)
    assert f"`{requestid}`" in response.body and "Creating mynb" in response.body
    assert published(deps)[0].requestid == requestid


@pytest.mark.parametrize("forgery", ["wrong secret", "stale", "tampered", "unsigned"])
def test_forged_or_stale_requests_get_401_and_do_nothing(forgery: str) -> None:
    app, deps = _app()
    body = _body("create mynb")
    headers = _headers(body)
    if forgery == "wrong secret":
        headers = _headers(body, secret="guess")
    elif forgery == "stale":
        headers = _headers(body, ts=int(time.time()) - 5 * 60 - 1)
    elif forgery == "tampered":
        body = _body("delete mynb")
    else:
        headers = {"Content-Type": "application/x-www-form-urlencoded"}
    assert app.dispatch(body, headers).status == 401
    assert published(deps) == []


def test_a_retry_header_marks_the_request_as_a_retry_with_the_same_id() -> None:
    app, deps = _app()
    body = _body("create mynb")
    assert app.dispatch(body, _headers(body)).status == 200
    assert app.dispatch(body, _headers(body, retry=1)).status == 200
    first, second = published(deps)
    assert first.requestid == second.requestid and first.id == second.id


def test_without_a_signing_secret_the_function_refuses_to_exist() -> None:
    from functions.adapters.slack import ChatNotConfigured

    with pytest.raises(ChatNotConfigured):
        ChatFunction(SlackSettings(None, None), lambda req: {})


def test_without_a_slack_team_the_function_refuses_to_exist() -> None:
    from functions.adapters.slack import ChatNotConfigured

    with pytest.raises(ChatNotConfigured, match="STASIS_SLACK_TEAM_ID"):
        ChatFunction(SlackSettings(SECRET, "xoxb-test"), lambda req: {})


@pytest.mark.parametrize("team", ["T0OTHER", ""])
def test_a_signed_request_from_another_slack_team_is_refused_and_does_nothing(
        team: str) -> None:
    # U0ALICE is alice in the catalog, but only in the Slack team T0: the same user id in
    # another Slack workspace (another install, a Slack Connect channel) is someone else.
    app, deps = _app()
    body = _body("create mynb --profile cpu-small", team=team)
    response = app.dispatch(body, _headers(body))  # signed with the app's own secret
    assert response.status == 200
    assert "another Slack workspace" in response.body and "T0" in response.body
    assert published(deps) == []


def test_the_configured_enterprise_is_checked_as_well() -> None:
    deps = chat_deps()
    app = ChatFunction(SlackSettings(SECRET, "xoxb-test", "http://127.0.0.1:9/api/",
                                     team_id="T0", enterprise_id="E0"),
                       lambda req: answer(req, deps))
    other = _body("create mynb --profile cpu-small", enterprise_id="E0OTHER")
    assert "another Slack organisation" in app.dispatch(other, _headers(other)).body
    assert published(deps) == []
    ours = _body("create mynb --profile cpu-small", enterprise_id="E0")
    assert "Creating mynb" in app.dispatch(ours, _headers(ours)).body
    assert len(published(deps)) == 1


_APP, _DEPS = _app(chat_deps(workspace("mynb"), workspace("paused", state=State.PAUSED,
                                                          current_snapshot="s1")))
_WORDS = st.sampled_from(["create", "pause", "resume", "delete", "list", "status", "help",
                          "--profile", "--team", "--keep-home", "--help", "mynb", "paused",
                          "cpu-small", "ml-b", "—profile", "-h", "=", "--", "ML-A", "<@U1>"])


@settings(max_examples=1000, deadline=None)
@given(st.one_of(st.text(max_size=200),
                 st.lists(_WORDS, max_size=8).map(" ".join),
                 st.lists(st.one_of(_WORDS, st.text(max_size=12)), max_size=6).map(" ".join)),
       st.sampled_from(["U0ALICE", "U0BOB", "U0CAROL", "U0NOBODY"]))
def test_any_command_text_gets_a_reply_and_never_a_crash(text: str, user: str) -> None:
    body = _body(text, user=user, trigger=f"{time.time_ns()}")
    response = _APP.dispatch(body, _headers(body))
    assert response.status == 200, response.body
    import json

    reply = json.loads(response.body)
    assert reply["text"].strip() and "_request `slack-" in reply["text"]
    assert "Something went wrong" not in reply["text"]


def test_the_catalog_in_these_tests_is_the_example() -> None:
    assert CATALOG.user_for_slack("U0ALICE") == "alice"


# -- /ws sandbox -----------------------------------------------------------------------------------

def _docs(deps: ChatDeps) -> dict[tuple[str, str], dict[str, Any]]:
    return deps.reads.docs  # type: ignore[attr-defined, no-any-return]


def test_a_sandbox_request_is_published_as_the_user_in_their_team_and_acked_running() -> None:
    deps = chat_deps()
    text = ask(deps, "sandbox /srv/calc --ref main --memory 1Gi -- make test")
    [event] = published(deps)
    sandbox_id = sandbox_id_for("slack-r1")
    assert f"Sandbox `{sandbox_id}` is running `make test` on /srv/calc@main" in text
    assert "I'll tell you here when it ends" in text
    assert event.payload == SandboxRequested(
        sandbox_id=sandbox_id, team="ml-a", requester="alice", repository="/srv/calc",
        command="make test", base_ref="main", limits={"memory": "1Gi"}, allowed_network=[],
        reply_to=event.payload.reply_to)
    assert (event.id, event.requestid) == ("slack-r1", "slack-r1")
    assert ReplyTarget.decode(event.payload.reply_to) == ReplyTarget("U0ALICE", "C0", "T0", URL,
                                                                     NOW)
    record = deps.records.recall("slack-r1")
    assert record is not None and (record["verb"], record["sandbox_id"]) == ("sandbox", sandbox_id)


def test_over_the_cap_the_ack_says_the_queue_position_from_the_teams_policy() -> None:
    deps = chat_deps()
    _docs(deps)[("sandbox_queues", "ml-a")] = {"running": ["sbx-a", "sbx-b"], "queued": ["sbx-c"]}
    text = ask(deps, "sandbox /srv/calc -- make")
    assert "is queued at position 2" in text and "runs 2/2 sandboxes" in text
    # The applied policy (catalog/current's sandboxes section) is the one previewed.
    deps = chat_deps()
    _docs(deps)[("catalog", "current")] = {"sandboxes": {"teams": {"ml-a": {"concurrency": 3}}}}
    _docs(deps)[("sandbox_queues", "ml-a")] = {"running": ["sbx-a", "sbx-b"], "queued": []}
    assert "is running" in ask(deps, "sandbox /srv/calc -- make")
    assert len(published(deps)) == 1


@pytest.mark.parametrize(("text", "says"), [
    ("sandbox /r --memory 64Gi -- make",
     "Nothing done: asked above team ml-a's sandbox maximum: memory 64Gi > 8Gi"),
    ("sandbox /r --allow pypi.org -- make",
     "Nothing done: network destinations not permitted for team ml-a's sandboxes: pypi.org "
     "(permitted: none)"),
    ("sandbox /r -- make --team ml-b", "is running"),  # after `--`: the task's, not ours
    ("sandbox /r --team ml-b -- make", "You are not a member of team ml-b"),
])
def test_what_admission_would_refuse_is_answered_at_once(text: str, says: str) -> None:
    deps = chat_deps()
    assert says in ask(deps, text)
    assert len(published(deps)) == (1 if "is running" in says else 0)


def test_a_viewer_is_told_sandboxes_take_the_member_role() -> None:
    config = yaml.safe_load((ROOT / "examples" / "stasis.yaml").read_text())
    config["teams"][0]["members"].append({"user": "vic", "slack_user_id": "U0VIC",
                                          "role": "viewer"})
    deps = chat_deps(catalog=Catalog.from_config(config))
    text = ask(deps, "sandbox /r -- make", user="U0VIC")
    assert "Nothing done: vic may only view team ml-a's work; ask alice" in text
    assert published(deps) == []


def test_a_slack_retry_names_the_same_sandbox_and_skips_the_preview() -> None:
    deps = chat_deps()
    ask(deps, "sandbox /r -- make")
    sandbox_id = sandbox_id_for("slack-r1")
    _docs(deps)[("sandboxes", sandbox_id)] = {"id": sandbox_id, "state": "QUEUED",
                                             "queue_position": 1, "command": "make",
                                             "repository": "/r", "message": "queued"}
    text = ask(deps, "sandbox /r -- make", retry=True)
    assert f"Sandbox `{sandbox_id}` is queued at position 1" in text
    first, again = published(deps)
    assert (again.id, again.requestid, again.payload) == (first.id, first.requestid,
                                                          first.payload)
    other = ask(deps, "sandbox /r -- make", requestid="slack-r2")
    assert sandbox_id_for("slack-r2") in other and sandbox_id_for("slack-r2") != sandbox_id


def test_a_failed_sandbox_publish_says_nothing_was_requested() -> None:
    deps = chat_deps(bus=FakeBus(fail=True))
    assert "I could not queue that (ConnectionError); nothing was requested" in ask(
        deps, "sandbox /r -- make")


def _sandbox_doc(sandbox_id: str, team: str = "ml-a", **fields: Any) -> dict[str, Any]:
    return {"id": sandbox_id, "team": team, "requester": "bob", "state": "RUNNING",
            "command": "python -m pytest -x", "repository": "/srv/calc", "base_ref": "main",
            "requested_at": NOW, "message": "running: 1/2", **fields}


def test_sandbox_list_shows_the_teams_own_recent_sandboxes() -> None:
    deps = chat_deps()
    docs = _docs(deps)
    docs[("sandboxes", "sbx-run")] = _sandbox_doc("sbx-run")
    docs[("sandboxes", "sbx-queued")] = _sandbox_doc("sbx-queued", state="QUEUED",
                                                     queue_position=1,
                                                     requested_at=NOW + timedelta(seconds=1))
    docs[("sandboxes", "sbx-old")] = _sandbox_doc(
        "sbx-old", state="SUCCEEDED", finished_at=NOW - timedelta(days=3),
        files_changed=["a.py"])
    docs[("sandboxes", "sbx-theirs")] = _sandbox_doc("sbx-theirs", team="ml-b")
    text = ask(deps, "sandbox list")
    assert text.index("`sbx-queued`  QUEUED #1") < text.index("`sbx-run`  RUNNING  (bob)")
    assert "sbx-old" not in text and "sbx-theirs" not in text
    everything = ask(deps, "sandbox list --all")
    assert "`sbx-old`  SUCCEEDED  (bob)  `python -m pytest -x`, 1 file changed" in everything
    theirs = ask(deps, "sandbox list", user="U0CAROL")
    assert "sbx-theirs" in theirs and "sbx-run" not in theirs
    assert "has no sandboxes from the last day" in ask(chat_deps(), "sandbox list")


def test_sandbox_show_tells_state_exit_files_and_how_to_review() -> None:
    deps = chat_deps()
    _docs(deps)[("sandboxes", "sbx-done")] = _sandbox_doc(
        "sbx-done", state="SUCCEEDED", exit_status=0, files_changed=["calc.py", "x.py"],
        patch_bytes=2048, patch_uri="gs://b/sandboxes/ml-a/sbx-done/patch.diff",
        duration_ms=3400, network="none: loopback only",
        message="the task succeeded; a patch of 2 files (2048 bytes) is ready for review")
    _docs(deps)[("sandboxes", "sbx-theirs")] = _sandbox_doc("sbx-theirs", team="ml-b")
    text = ask(deps, "sandbox show sbx-done")
    assert "`sbx-done` (team ml-a, requested by bob): *SUCCEEDED*" in text
    assert "exit status 0, ran 3.4 s, network: none: loopback only" in text
    assert "2 files changed (2 KiB patch): `calc.py`, `x.py`" in text
    assert "`stasis sandbox show sbx-done` then `stasis sandbox apply sbx-done --to CHECKOUT`" \
        in text and "gs://b/sandboxes/ml-a/sbx-done/patch.diff" in text
    assert "There is no sandbox sbx-theirs in your teams (ml-a)" in ask(
        deps, "sandbox show sbx-theirs")
    assert "There is no sandbox sbx-nope" in ask(deps, "sandbox show sbx-nope")


def test_invalid_sandbox_input_gets_the_problem_and_the_usage() -> None:
    deps = chat_deps()
    text = ask(deps, "sandbox /r make test")
    assert "unexpected `make`" in text and "Usage: `/ws sandbox REPOSITORY" in text
    assert published(deps) == []


def test_a_signed_sandbox_command_is_acked_with_its_sandbox_id() -> None:
    app, deps = _app()
    body = _body("sandbox https://github.com/acme/calc -- python -m pytest -x")
    response = app.dispatch(body, _headers(body))
    assert response.status == 200
    requestid = signing.request_id("1.2.abc", body)
    assert f"`{requestid}`" in response.body
    assert f"Sandbox `{sandbox_id_for(requestid)}` is running" in response.body
    [event] = published(deps)
    assert (event.requestid, event.payload.command) == (requestid, "python -m pytest -x")


def test_a_command_whose_text_says_payload_is_still_a_command() -> None:
    # bolt reads any form body containing "payload" as an interactivity payload.
    app, deps = _app()
    body = _body("sandbox /r -- pytest tests/test_payload.py")
    response = app.dispatch(body, _headers(body))
    assert response.status == 200, response.body
    [event] = published(deps)
    assert event.payload.command == "pytest tests/test_payload.py"


def test_the_flask_entry_point_serves_a_signed_command_and_refuses_a_forged_one() -> None:
    from flask import Flask

    app, deps = _app()
    body = _body("sandbox /r -- python payload.py")
    flask = Flask("chat")
    for headers, status in ((_headers(body), 200), (_headers(body, secret="wrong"), 401)):
        with flask.test_request_context("/chat/", method="POST", data=body, headers={
                **headers, "Content-Type": "application/x-www-form-urlencoded"}):
            from flask import request

            response = app.handle(request)
        assert response.status_code == status
    [event] = published(deps)
    assert event.payload.command == "python payload.py"


def _suspended(deps: ChatDeps, sandbox_id: str = "sbx-held", **fields: Any) -> None:
    _docs(deps)[("sandboxes", sandbox_id)] = _sandbox_doc(
        sandbox_id, state="SUSPENDED", reason="suspended_idle", requester="alice",
        limits={"cpu_seconds": 60, "memory_bytes": 2**30, "wall_clock_seconds": 60,
                "processes": 64, "idle_seconds": 30},
        allowed_network=[], requestid="slack-first", version=3,
        suspended_at=NOW - timedelta(minutes=5), message="suspended: idle", **fields)


def test_a_suspended_sandbox_is_resumed_from_chat_and_show_says_how() -> None:
    deps = chat_deps()
    _suspended(deps)
    assert "`/ws sandbox resume sbx-held` brings it back" in ask(deps, "sandbox show sbx-held")
    text = ask(deps, "sandbox resume sbx-held", requestid="slack-r9")
    assert "Resuming sandbox `sbx-held` now: resumed after 300 s suspended" in text
    [event] = published(deps)
    assert (event.name, event.id, event.payload.sandbox_id, event.payload.requester) == (
        "sandbox.resume_requested", "slack-r9", "sbx-held", "alice")
    assert ReplyTarget.decode(event.payload.reply_to) is not None


def test_a_resume_waits_for_a_slot_or_is_refused_with_the_reason() -> None:
    deps = chat_deps()
    _suspended(deps)
    _docs(deps)[("sandbox_queues", "ml-a")] = {"running": ["sbx-a", "sbx-b"], "queued": []}
    assert "will resume when a slot frees up: resume queued: team ml-a runs 2/2 sandboxes; " \
           "position 1 of 1" in ask(deps, "sandbox resume sbx-held")
    _docs(deps)[("sandboxes", "sbx-run")] = _sandbox_doc(
        "sbx-run", limits={"cpu_seconds": 60, "memory_bytes": 2**30,
                           "wall_clock_seconds": 60, "processes": 64},
        allowed_network=[], requestid="x", version=2, reason="admitted")
    assert "Nothing done: sandbox sbx-run is RUNNING, not suspended: nothing to resume" in ask(
        deps, "sandbox resume sbx-run", requestid="slack-r2")
    _docs(deps)[("sandboxes", "sbx-theirs")] = _sandbox_doc("sbx-theirs", team="ml-b")
    assert "There is no sandbox sbx-theirs in your teams" in ask(
        deps, "sandbox resume sbx-theirs", requestid="slack-r3")
    assert len(published(deps)) == 1
