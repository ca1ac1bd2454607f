"""The shape of the `stasis` command (stasis_cli/): every verb that acts as a user or prints
data takes ``--as`` and ``--json``; loading the command imports no SDK, and a read verb
imports only what it reads with."""

from __future__ import annotations

import contextlib
import json
import subprocess
import sys
import textwrap
import threading
from collections.abc import Iterator
from pathlib import Path

import click
import pytest
from click.testing import CliRunner

from stasis_cli import options
from stasis_cli.main import main

ROOT = Path(__file__).resolve().parents[2]

#: Verbs that act as no user, and why (a new verb must take --as, or say here why not).
NO_AS: dict[str, str] = {
    "up": "starts the local stack's processes, as no user",
    "down": "stops the local stack's processes, as no user",
    "status": "reports the local stack's processes, as no user",
    "events publish": "the payload names its actor",
    "events monitoring": "replays a monitoring system's notification, as no user",
    "dlq": "an operator's view of every consumer's dead letters",
    "idle sweep": "runs the scheduled sweep now, as the scheduler does",
    "janitor": "runs the scheduled janitor now, as the scheduler does",
    "cost": "runs the scheduled cost rollup now, as the scheduler does",
    "reconcile": "runs the scheduled reconciler now, as the scheduler does",
    "exec": "the link is the identity",
    "link sandbox": "the link is the identity",
    "bundle": "deploy tooling: builds files, as no user",
}
#: Verbs that print no data of their own, and why (a new verb must take --json, or say why).
NO_JSON: dict[str, str] = {
    "exec": "streams the cell's own output; the exit status is the cell's",
    "link sandbox": "prints the sandbox id, or the patch itself for a pipe",
    "bundle": "deploy tooling: writes the zip and the Terraform variables",
}
#: What no verb needs loaded just to be found: `stasis --help` imports none of them.
#: (``google`` and ``google.cloud`` themselves are namespaces that site-packages' .pth
#: files load into every interpreter.)
SDKS = ("google.cloud.firestore", "google.cloud.pubsub", "google.cloud.storage",
        "google.api_core", "google.auth", "grpc", "kubernetes", "slack_bolt", "slack_sdk",
        "jupyter_client", "jupyter_server", "jsonschema", "requests", "psutil", "yaml",
        "events", "runtime")
#: Of the control plane, only the table of declared queries (standard library only), which
#: `stasis bundle`'s option defaults reach through deploy.tfvars.
LIGHT_FUNCTIONS = {"functions", "functions.queries"}


def _verbs(group: click.Group, prefix: str = "") -> Iterator[tuple[str, click.Command]]:
    for name, command in sorted(group.commands.items()):
        path = f"{prefix}{name}"
        if isinstance(command, click.Group):
            yield from _verbs(command, path + " ")
        else:
            yield path, command


def _options(command: click.Command) -> set[str]:
    return {opt for param in command.params if isinstance(param, click.Option)
            for opt in param.opts}


VERBS = dict(_verbs(main))


@pytest.mark.parametrize("verb", sorted(VERBS))
def test_every_verb_that_acts_or_prints_takes_as_and_json(verb: str) -> None:
    have = _options(VERBS[verb])
    if verb not in NO_AS:
        assert "--as" in have, f"`stasis {verb}` acts as a user: it must take --as"
    if verb not in NO_JSON:
        assert "--json" in have, f"`stasis {verb}` prints data: it must take --json"


def test_the_exemptions_name_real_verbs_that_lack_the_option() -> None:
    """An exemption for a verb that is gone, or that took the option since, is stale."""
    assert set(NO_AS) <= set(VERBS) and set(NO_JSON) <= set(VERBS)
    assert [v for v in NO_AS if "--as" in _options(VERBS[v])] == []
    assert [v for v in NO_JSON if "--json" in _options(VERBS[v])] == []


def test_sandbox_show_takes_as_now() -> None:
    """The complaint of issue 15: `stasis sandbox show --as alice` was "No such option"."""
    result = CliRunner().invoke(main, ["sandbox", "show", "--as", "alice", "--help"])
    assert result.exit_code == 0, result.output
    assert "--as USER" in result.output


def test_the_acting_user_is_as_then_stasis_user_then_dev(
        monkeypatch: pytest.MonkeyPatch) -> None:
    @click.command()
    @options.as_user
    def who() -> None:
        click.echo(options.acting_user())

    monkeypatch.delenv("STASIS_USER", raising=False)
    assert CliRunner().invoke(who, []).output.strip() == "dev"
    monkeypatch.setenv("STASIS_USER", "bob")
    assert CliRunner().invoke(who, []).output.strip() == "bob"
    assert CliRunner().invoke(who, ["--as", "alice"]).output.strip() == "alice"


def _loaded_after(code: str) -> tuple[list[str], str]:
    """The packages among ``SDKS`` (and the like) that a fresh interpreter has loaded after
    running ``code``, and what ``code`` printed."""
    script = textwrap.dedent(code) + textwrap.dedent("""
        import json as _json, sys as _sys
        print("MODULES " + _json.dumps(sorted(k for k, v in _sys.modules.items() if v)))
    """)
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                          cwd=ROOT, timeout=120, check=False)
    assert done.returncode == 0, done.stderr
    printed, _, modules = done.stdout.rpartition("MODULES ")
    return json.loads(modules), printed


def _among(loaded: list[str], packages: tuple[str, ...]) -> list[str]:
    """The packages of which ``loaded`` holds the package itself or a module of it."""
    return [p for p in packages if any(m == p or m.startswith(p + ".") for m in loaded)]


def test_stasis_help_imports_no_sdk() -> None:
    loaded, printed = _loaded_after("""
        from stasis_cli.main import main
        main(["--help"], standalone_mode=False)
    """)
    assert "Commands:" in printed
    assert _among(loaded, SDKS) == []
    assert {m for m in loaded if m.split(".")[0] == "functions"} <= LIGHT_FUNCTIONS


def test_ws_list_and_create_import_no_sdk_and_no_event_schemas() -> None:
    """`stasis ws list` and `stasis ws create` (without --wait) ask the control plane's
    ``cli`` function over HTTP: no Google client, no event schemas, not even requests."""
    loaded, printed = _loaded_after("""
        from stasis_cli import door
        door.workspaces = lambda *a, **kw: [{"team": "ml-a", "name": "nb", "state":
            "RUNNING", "profile": "cpu-small", "owner": "dev"}]
        door.request = lambda settings, user, body: door.Requested(
            id="e1", type="dev.stasis.workspace.requested", name="workspace.requested",
            requestid="r1", subject="ml-a--" + body["name"], team="ml-a")
        from stasis_cli.main import main
        main(["ws", "list"], standalone_mode=False)
        main(["ws", "create", "nb2"], standalone_mode=False)
    """)
    assert "ml-a     nb" in printed
    assert "requested workspace.requested for ml-a--nb2 (request r1); follow it with " \
           "`stasis ws status nb2`" in printed
    assert _among(loaded, SDKS) == []
    assert {m for m in loaded if m.split(".")[0] == "functions"} <= LIGHT_FUNCTIONS


def test_every_exit_status_is_in_the_help() -> None:
    from stasis_cli import options
    from stasis_cli.main import main

    shown = " ".join(CliRunner().invoke(main, ["--help"]).output.split())
    assert options.EXIT_STATUSES in shown
    for status in (options.EXIT_DONE, options.EXIT_REFUSED, options.EXIT_BAD_INPUT,
                   options.EXIT_LINK_REFUSED, options.EXIT_UNAVAILABLE, options.EXIT_SUSPENDED):
        assert f"{status} " in options.EXIT_STATUSES


def test_a_refusal_exits_2_and_an_unanswered_call_4(monkeypatch: pytest.MonkeyPatch,
                                                     tmp_path: Path) -> None:
    from stasis_cli.main import main

    monkeypatch.setenv("STASIS_DATA_DIR", str(tmp_path))
    monkeypatch.setenv("STASIS_FUNCTIONS_PORT", "9")  # discard: nothing answers there
    down = CliRunner().invoke(main, ["ws", "pause", "nb"])
    assert down.exit_code == 4 and "is the stack up" in down.output
    bad = CliRunner().invoke(main, ["ws", "create", "nb", "--bogus"])
    assert bad.exit_code == 2


def test_status_without_a_stack_says_so_and_still_shows_where_things_would_be(
        monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    from functions.routes import HTTP_FUNCTIONS

    monkeypatch.setenv("STASIS_DATA_DIR", str(tmp_path))
    monkeypatch.setenv("STASIS_PROJECT", "p-status")
    monkeypatch.setenv("STASIS_FUNCTIONS_PORT", "18713")
    result = CliRunner().invoke(main, ["status"])
    assert result.exit_code == 1
    assert f"project p-status, data dir {tmp_path}" in result.output
    assert "the local stack is not running (start it with `stasis up`)" in result.output
    for name, http in HTTP_FUNCTIONS.items():
        assert f"  {name:<12} {f'http://127.0.0.1:18713/{name}/':<42} {http.exposure}" \
            in result.output
    assert "janitor      http://127.0.0.1:18713/janitor/" in result.output
    view = json.loads(CliRunner().invoke(main, ["status", "--json"]).output)
    assert (view["project"], view["services"]) == ("p-status", [])
    assert list(view["endpoints"]) == list(HTTP_FUNCTIONS)
    assert view["endpoints"]["dashboard"] == {
        "url": "http://127.0.0.1:18713/dashboard/", "exposure": "iap", "schedule": None}
    assert view["endpoints"]["idle_sweep"]["schedule"] == HTTP_FUNCTIONS["idle_sweep"].schedule


def test_the_console_script_validates_events_without_rfc3987_syntax() -> None:
    """`stasis` (``run``) keeps jsonschema from importing rfc3987_syntax (0.75 s of lark
    grammar for iri formats no schema here checks), and a bad payload is still refused."""
    bad = json.dumps({"team": "ml-a", "owner": "dev", "name": "My_NB", "profile": "cpu-small"})
    loaded, printed = _loaded_after(f"""
        import sys
        sys.argv = ["stasis", "events", "publish", "workspace.requested", "--data", {bad!r}]
        sys.stderr = sys.stdout
        from stasis_cli.main import run
        try:
            run()
        except SystemExit as exc:
            print("EXIT", exc.code)
    """)
    assert "EXIT 2" in printed and "/name: 'My_NB' does not match" in printed
    assert _among(loaded, ("jsonschema", "events")) == ["jsonschema", "events"]
    assert _among(loaded, ("rfc3987_syntax", "lark")) == []


def test_wait_reads_the_verdict_the_front_door_named_without_the_routes() -> None:
    """`--wait` after the front door reads the ledger entry by the id the door answered:
    neither the routes nor the event schemas are imported (0.7 s of CPU in each of ten
    CLIs at once, bench/spawn_vs_jupyterhub.py)."""
    loaded, printed = _loaded_after("""
        import contextlib, threading
        from stasis_cli import client, door
        read = []
        docs = {("processed", "k-verdict"): {"outcome": {"accepted": True}},
                ("workspaces", "ml-a--nb"): {"state": "RUNNING"}}

        class Snap:
            def __init__(self, key):
                read.append(key)
                self.exists, self.doc = key in docs, docs.get(key)
            def to_dict(self):
                return self.doc

        class Db:
            def collection(self, name):
                return type("C", (), {"document": lambda _, doc_id: type(
                    "D", (), {"get": lambda _: Snap((name, doc_id))})()})()

        client._db = lambda: Db()
        client._watching = lambda ws_id: contextlib.nullcontext(threading.Event())
        requested = door.Requested(id="e1", type="dev.stasis.workspace.requested",
                                   name="workspace.requested", requestid="r1",
                                   subject="ml-a--nb", team="ml-a", verdict="k-verdict")
        done = client.follow(None, requested, until={"RUNNING"}, timeout=10)
        print(done["ok"], read)
    """)
    assert printed.strip() == "True [('processed', 'k-verdict'), ('workspaces', 'ml-a--nb')]"
    assert {m for m in loaded if m.split(".")[0] == "functions"} <= LIGHT_FUNCTIONS
    assert "functions.routes" not in loaded and _among(loaded, ("events",)) == []


def test_wait_backs_off_while_nothing_changes(monkeypatch: pytest.MonkeyPatch) -> None:
    """`--wait` reads the ledger, then the workspace, less often while nothing changes (ten
    followers at once are not a storm of reads), and quickly again after a change."""
    from stasis_cli import client, door

    verdicts = iter([None] * 8 + [{"accepted": True}])
    states = iter(["REQUESTED"] * 8 + ["PROVISIONING"] + ["RUNNING"])
    slept: list[float] = []
    monkeypatch.setattr(client, "outcome", lambda event: next(verdicts))
    monkeypatch.setattr(client, "workspace", lambda ws_id: {"state": next(states)})
    monkeypatch.setattr(client, "_progress_line", lambda settings, ws_id: None)
    monkeypatch.setattr(client.time, "sleep", slept.append)

    class Unchanged(threading.Event):  # no listener: the follower reads on its schedule
        def wait(self, timeout: float | None = None) -> bool:
            slept.append(float(timeout or 0))
            return False

    @contextlib.contextmanager
    def unwatched(ws_id: str) -> Iterator[threading.Event]:
        yield Unchanged()

    monkeypatch.setattr(client, "_watching", unwatched)
    requested = door.Requested(id="e1", type="dev.stasis.workspace.requested",
                               name="workspace.requested", requestid="r1", subject="ml-a--nb",
                               team="ml-a")
    done = client.follow(None, requested, until={"RUNNING"})  # type: ignore[arg-type]
    assert done["ok"] is True
    ledger, docs = slept[:8], slept[8:]
    assert ledger == sorted(ledger) and ledger[0] == 0.1 and ledger[-1] == 1.0
    assert docs[:8] == sorted(docs[:8]) and max(docs) <= 1.0
    assert docs[8] == 0.1  # the state changed: read soon again
