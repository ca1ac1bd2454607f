"""Issue 24 on the whole local stack (null runtime), tried as a new user: the five commands that
used to say "requested" and were refused out of sight are answered at once by the CLI, with
exit status 2 and the domain's words, and by chat's /ws with the same words; nothing reaches
the topics (a real pull on them stays empty). A request that passes the preview but loses
the last quota slot in a race still ends, under --wait, with the handler's reason."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

import yaml
from google.cloud import pubsub_v1

from events import spec_for
from functions.bootstrap import CATALOG_TTL_SECONDS
from functions.domain import frontdoor
from functions.domain.catalog import Catalog
from functions.domain.frontdoor import Door
from functions.routes import ROUTES
from stack.chat import ChatClient

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "stasis.yaml"
CATALOG = Catalog.from_config(yaml.safe_load(EXAMPLE.read_text()))
ML_A = CATALOG.teams["ml-a"]

#: The issue's five commands (as alice, a member of ml-a only), their /ws equivalents, and
#: the refusal the domain says for each.
FINDINGS = [
    (["ws", "create", "My_NB", "--team", "ml-a", "--profile", "cpu-small"],
     "create My_NB --team ml-a --profile cpu-small", frontdoor.name_refusal("My_NB")),
    (["ws", "create", "nb", "--team", "ml-z", "--profile", "cpu-small"],
     "create nb --team ml-z --profile cpu-small", frontdoor.choose_team(CATALOG, "alice", "ml-z")),
    (["ws", "create", "nb", "--team", "ml-a", "--profile", "gpu-huge"],
     "create nb --team ml-a --profile gpu-huge",
     "There is no profile gpu-huge. Profiles for team ml-a: " + ", ".join(ML_A.profiles) + "."),
    (["ws", "create", "nb", "--team", "ml-b", "--profile", "cpu-small"],
     "create nb --team ml-b --profile cpu-small", frontdoor.choose_team(CATALOG, "alice", "ml-b")),
    (["ws", "pause", "nothere"], "pause nothere",
     "There is no workspace nothere in team ml-a. See `stasis ws list`."),
]


def test_the_five_commands_are_refused_at_once_by_the_cli_and_chat_and_nothing_is_published(
        null_stack):
    topics = {spec_for(e).topic for e in ("workspace.requested", "workspace.pause_requested")}
    subscriptions = [null_stack.subscribe(t) for t in sorted(topics)]
    chat = ChatClient(null_stack.settings)
    for argv, slash, said in FINDINGS:
        assert isinstance(said, str)
        began = time.perf_counter()
        out = null_stack.cli(*argv, user="alice", check=False)
        took = time.perf_counter() - began
        assert out.returncode == 2, (argv, out.stdout, out.stderr)
        assert out.stderr.strip() == frontdoor.refused(said, Door.CLI), argv
        assert "requested" not in out.stdout and took < 30
        sent = chat.send(slash, user="U0ALICE")
        assert sent.status == 200
        if argv[2] == "My_NB":  # chat's grammar says it, with the command's usage
            assert sent.text.startswith(str(frontdoor.check_name("My_NB")))
        else:
            assert sent.text.startswith(frontdoor.refused(said, Door.CHAT) + "\n"), sent.text
    # Nothing reached either topic: a real pull on each stays empty.
    for subscription in subscriptions:
        assert null_stack.pull(subscription, want=1, timeout=3) == []


def test_what_passes_says_how_to_follow_it_and_is_published(null_stack):
    out = null_stack.cli("ws", "create", "follow-me", "--team", "ml-a", user="alice")
    assert out.stdout.strip().endswith(
        "follow it with `stasis ws status follow-me --team ml-a`"), out.stdout
    null_stack.wait_for(lambda: (null_stack.workspace("ml-a--follow-me") or {}).get("state")
                        == "RUNNING", what="follow-me RUNNING")
    rows = json.loads(null_stack.cli("ws", "list", "--json", user="alice").stdout)
    assert ("ml-a", "follow-me", "alice") in {(r["team"], r["name"], r["owner"]) for r in rows}
    assert all(r["team"] == "ml-a" for r in rows)  # only alice's team


def test_a_request_that_loses_the_last_quota_slot_ends_with_the_handlers_reason(
        null_stack, tmp_path):
    # ml-b gets one workspace slot; carol (its admin) asks for two at once.
    admin = yaml.safe_load(EXAMPLE.read_text())
    team_b = next(t for t in admin["teams"] if t["id"] == "ml-b")
    team_b["quotas"]["workspaces"] = 1
    applied = tmp_path / "one-slot.yaml"
    applied.write_text(yaml.safe_dump(admin))
    null_stack.cli("admin", "apply", str(applied))
    time.sleep(CATALOG_TTL_SECONDS + 0.5)  # the function host's catalog has been re-read
    # Hold the provisioning function's deliveries (its push subscription pulled, for a
    # moment), so both requests pass the preview before either is charged.
    subscriber = pubsub_v1.SubscriberClient()
    provision = next(r for r in ROUTES.values() if r.event == "workspace.requested")
    name = subscriber.subscription_path(null_stack.settings.project, provision.subscription)
    push = subscriber.get_subscription(request={"subscription": name}).push_config
    seen = null_stack.subscribe(provision.topic)
    subscriber.modify_push_config(request={"subscription": name, "push_config": {}})
    env = {**null_stack.env, "STASIS_USER": "carol"}
    try:
        racers = [subprocess.Popen(
            [sys.executable, "-m", "stasis_cli", "ws", "create", f"race-{i}", "--team", "ml-b",
             "--wait"], env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
            for i in (1, 2)]
        # Both passed the preview and were published; neither was delivered yet.
        assert len(null_stack.pull(seen, want=2, timeout=120)) == 2
        assert all(null_stack.workspace(f"ml-b--race-{i}") is None for i in (1, 2))
    finally:
        subscriber.modify_push_config(request={"subscription": name, "push_config": push})
    ends = [r.communicate(timeout=240) for r in racers]
    codes = sorted(r.returncode for r in racers)
    assert codes == [0, 1], ends
    lost = next(out for r, out in zip(racers, ends, strict=True) if r.returncode == 1)
    assert "refused: team ml-b has 1/1 workspaces" in lost[0], lost
