"""The /ws grammar as a table: text -> Command, Help or ParseError (with what to type)."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from functions.chatops.grammar import (
    VERBS,
    Command,
    Help,
    ParseError,
    SandboxAction,
    SandboxArgs,
    Verb,
    check_name,
    help_text,
    parse,
    show,
    suggest_name,
)

C = Command


@pytest.mark.parametrize(("text", "expected"), [
    ("create mynb --profile cpu-small", C(Verb.CREATE, name="mynb", profile="cpu-small")),
    ("create mynb cpu-small", C(Verb.CREATE, name="mynb", profile="cpu-small")),
    ("create mynb --profile=cpu-small --ide vscode --env python-3-10 --team ml-b",
     C(Verb.CREATE, name="mynb", profile="cpu-small", ide="vscode",
       environment="python-3-10", team="ml-b")),
    ("  CREATE   mynb  ", C(Verb.CREATE, name="mynb")),
    ("create mynb \u2014profile cpu-small", C(Verb.CREATE, name="mynb", profile="cpu-small")),
    ("create mynb \u2013profile=cpu-small", C(Verb.CREATE, name="mynb", profile="cpu-small")),
    ("create \u201cmynb\u201d", C(Verb.CREATE, name="mynb")),
    ("create\u00a0mynb", C(Verb.CREATE, name="mynb")),
    ("list", C(Verb.LIST)),
    ("ls --all", C(Verb.LIST, all=True)),
    ("list --team ml-a", C(Verb.LIST, team="ml-a")),
    ("status mynb", C(Verb.STATUS, name="mynb")),
    ("pause mynb", C(Verb.PAUSE, name="mynb")),
    ("resume mynb", C(Verb.RESUME, name="mynb")),
    ("resume mynb cpu-large", C(Verb.RESUME, name="mynb", profile="cpu-large")),
    ("resume mynb cpu-large --device-arrays-to-cpu",
     C(Verb.RESUME, name="mynb", profile="cpu-large", device_arrays_to_cpu=True)),
    ("delete mynb --keep-home", C(Verb.DELETE, name="mynb", keep_home=True)),
    ("rm mynb", C(Verb.DELETE, name="mynb")),
    ("snapshots mynb", C(Verb.SNAPSHOTS, name="mynb")),
    ("catalog", C(Verb.CATALOG)),
    ("quota --team ml-b", C(Verb.QUOTA, team="ml-b")),
    ("link mynb", C(Verb.LINK, name="mynb")),
    ("revoke lnk-3f2a", C(Verb.REVOKE, link="lnk-3f2a")),
])
def test_commands(text: str, expected: Command) -> None:
    assert parse(text) == expected


@pytest.mark.parametrize(("text", "topic"), [
    ("", None), ("   ", None), ("help", None), ("?", None), ("--help", None), ("-h", None),
    ("help create", Verb.CREATE), ("help --pause", Verb.PAUSE), ("create --help", Verb.CREATE),
    ("pause mynb -h", Verb.PAUSE), ("delete --HELP", Verb.DELETE), ("help ls", Verb.LIST),
])
def test_help(text: str, topic: Verb | None) -> None:
    assert parse(text) == Help(topic)


@pytest.mark.parametrize(("text", "verb", "says"), [
    ("pasue mynb", None, "Did you mean `pause`?"),
    ("craete mynb", None, "Did you mean `create`?"),
    ("snap mynb", None, "Did you mean `snapshots`?"),
    ("frobnicate", None, "`/ws help` explains them"),
    ("help frobnicate", Verb.HELP, "no command `frobnicate`"),
    ("status", Verb.STATUS, "NAME is missing"),
    ("create", Verb.CREATE, "Usage: `/ws create NAME [PROFILE]"),
    ("status a1 b1", Verb.STATUS, "unexpected `b1`"),
    ("delete mynb --keep", Verb.DELETE, "Did you mean `--keep-home`?"),
    ("list --tem ml-a", Verb.LIST, "Did you mean `--team`?"),
    ("pause mynb --profile x1", Verb.PAUSE, "Options: `--team TEAM`"),
    ("create mynb --profile", Verb.CREATE, "`--profile` needs a value"),
    ("create mynb --profile --ide vscode", Verb.CREATE, "`--profile` needs a value"),
    ("create mynb --profile a1 --profile b1", Verb.CREATE, "`--profile` is given twice"),
    ("create mynb cpu-small --profile b1", Verb.CREATE, "PROFILE is given twice"),
    ("delete mynb --keep-home=yes", Verb.DELETE, "takes no value"),
    ("create MyNB", Verb.CREATE, "names are lowercase. Try `mynb`."),
    ("create my_nb", Verb.CREATE, "Try `my-nb`."),
    ("create a--b", Verb.CREATE, "double dash"),
    ("create x", Verb.CREATE, "too short"),
    ("create " + "a" * 41, Verb.CREATE, "longer than 40"),
    ("create mynb --profile CPU", Verb.CREATE, "profiles are lowercase"),
    ("create mynb --team ml_a", Verb.CREATE, "Try `ml-a`."),
    ("revoke <@U1>", Verb.REVOKE, "is not a link id"),
])
def test_errors_say_what_to_do(text: str, verb: Verb | None, says: str) -> None:
    result = parse(text)
    assert isinstance(result, ParseError), result
    assert result.verb == verb
    assert says in result.message


@pytest.mark.parametrize(("value", "fix"), [
    ("MyNotebook", "mynotebook"), ("my_nb", "my-nb"), ("été 2024", "ete-2024"),
    ("--x--y--", "x-y"), ("42", None), ("", None),
])
def test_name_suggestions(value: str, fix: str | None) -> None:
    assert suggest_name(value) == fix


def test_valid_names_pass() -> None:
    for name in ("ab", "mynb", "llm-finetune-2", "a" * 40):
        assert check_name(name) is None


def test_echoed_input_cannot_break_out_of_a_code_span_or_mention_anyone() -> None:
    shown = show("`<!channel>` & \x00" + "z" * 100)
    assert "`" not in shown and "<" not in shown and ">" not in shown and "\x00" not in shown
    assert "&amp;" in shown and shown.endswith("…") and len(shown) < 80


def test_every_verb_has_help_with_its_usage_and_examples() -> None:
    overview = help_text()
    for verb, spec in VERBS.items():
        assert f"`{verb}`" in overview
        text = help_text(verb)
        assert spec.usage() in text
        for example in spec.examples:
            assert parse(example.removeprefix("/ws ")) is not None
            assert example in text


def test_every_example_parses_to_its_verb() -> None:
    for verb, spec in VERBS.items():
        for example in spec.examples:
            result = parse(example.removeprefix("/ws "))
            assert isinstance(result, Command | Help)
            if verb != Verb.HELP:
                assert isinstance(result, Command) and result.verb == verb


@settings(max_examples=1000, deadline=None)
@given(st.text(max_size=300))
def test_any_text_parses_to_one_of_three_answers(text: str) -> None:
    result = parse(text)
    assert isinstance(result, Command | Help | ParseError)
    if isinstance(result, ParseError):
        assert result.message.strip()


# -- /ws sandbox: free text after `--` -----------------------------------------------------------

def _sbx(**fields: Any) -> Command:
    team = fields.pop("team", None)
    return Command(Verb.SANDBOX, team=team, sandbox=SandboxArgs(**fields))


RUN = SandboxAction.RUN


@pytest.mark.parametrize(("text", "expected"), [
    ("sandbox https://github.com/acme/calc -- python -m pytest -x",
     _sbx(action=RUN, repository="https://github.com/acme/calc", task="python -m pytest -x")),
    ("sandbox /srv/calc --ref v1.2 --cpu-seconds 120 --memory 4Gi --wall-clock 30m "
     "--processes 64 --allow pypi.org --allow *.github.com --allow pypi.org --team ml-b "
     "-- make test",
     _sbx(action=RUN, repository="/srv/calc", ref="v1.2", team="ml-b", task="make test",
          limits=(("cpu_seconds", 120), ("memory", "4Gi"), ("wall_clock_seconds", 1800),
                  ("processes", 64)), allow=("pypi.org", "*.github.com"))),
    # The task is kept as typed: quotes, dashes, options of its own.
    ('sandbox /r -- pytest -k "not slow" --maxfail=1 -- extra',
     _sbx(action=RUN, repository="/r", task='pytest -k "not slow" --maxfail=1 -- extra')),
    # What Slack and chat clients do to text, undone.
    ("sandbox <https://github.com/acme/calc|github.com/acme/calc> -- make &amp;&amp; cat x "
     "&gt; y &lt; z",
     _sbx(action=RUN, repository="https://github.com/acme/calc", task="make && cat x > y < z")),
    ("sandbox /r \u2014 echo \u201chi\u201d \u2018there\u2019",
     _sbx(action=RUN, repository="/r", task="echo \"hi\" 'there'")),
    ("sandbox /r --disk 4Gi -- true",
     _sbx(action=RUN, repository="/r", limits=(("disk", "4Gi"),), task="true")),
    ("sandbox /r --wall-clock=90s --ref=HEAD~1 -- true",
     _sbx(action=RUN, repository="/r", ref="HEAD~1", limits=(("wall_clock_seconds", 90),),
          task="true")),
    ("sandbox git@github.com:acme/calc.git -- true",
     _sbx(action=RUN, repository="git@github.com:acme/calc.git", task="true")),
    ("sandbox list", _sbx(action=SandboxAction.LIST)),
    ("SANDBOX list --all --team ml-b", _sbx(action=SandboxAction.LIST, all=True, team="ml-b")),
    ("sandbox show sbx-20260504-120000-ab12cd",
     _sbx(action=SandboxAction.SHOW, sandbox_id="sbx-20260504-120000-ab12cd")),
    ("sandbox resume sbx-1 --team ml-a",
     _sbx(action=SandboxAction.RESUME, sandbox_id="sbx-1", team="ml-a")),
])
def test_sandbox_commands(text: str, expected: Command) -> None:
    assert parse(text) == expected


@pytest.mark.parametrize(("text", "says"), [
    ("sandbox", "REPOSITORY is missing"),
    ("sandbox /r", "the task command is missing: put it after a standalone `--`"),
    ("sandbox /r --", "the task command is missing"),
    ("sandbox /r make test", "unexpected `make`: the task command goes after"),
    ("sandbox /r sed -i s/a/b/ x.py", "If it is part of the task command, put the command "
                                      "after a standalone `--`"),
    ("sandbox calc -- true", "`calc` is not a repository"),
    ("sandbox /r --reff main -- true", "Did you mean `--ref`?"),
    ("sandbox /r --ref -- true", "`--ref` needs a value"),
    ("sandbox /r --ref --upload-pack=x -- true", "`--ref` needs a value"),
    ("sandbox /r --ref -c -- true", "`-c` is not a git ref"),
    ("sandbox /r --memory 2m -- true", "memory takes a size like 2Gi"),
    ("sandbox /r --disk lots -- true", "disk takes a size like 4Gi"),
    ("sandbox /r --cpu-seconds ten -- true", "cpu-seconds takes a whole number"),
    ("sandbox /r --cpu-seconds 0 -- true", "must be at least 1"),
    ("sandbox /r --wall-clock soon -- true", "a duration like 30m"),
    ("sandbox /r --memory 1Gi --memory 2Gi -- true", "`--memory` is given twice"),
    ("sandbox /r --allow pypi.org?x=1 -- true", "is not a network destination"),
    ("sandbox /r --team ML_A -- true", "Try `ml-a`."),
    ("sandbox /r -- " + "x" * 10_001, "over 10000 characters"),
    ("sandbox list -- true", "`sandbox list` takes no task command"),
    ("sandbox list extra", "unexpected `extra`"),
    ("sandbox show", "give one sandbox id"),
    ("sandbox show a b", "unexpected `b`"),
    ("sandbox show <@U1>", "is not a sandbox id"),
    ("sandbox show sbx-1 --all", "is not an option of `sandbox show`"),
    ("sandbox resume", "Usage: `/ws sandbox resume ID [--team TEAM]`"),
    ("sandbox resume sbx-1 -- x", "`sandbox resume` takes no task command"),
])
def test_sandbox_errors_name_the_problem_and_show_the_usage(text: str, says: str) -> None:
    result = parse(text)
    assert isinstance(result, ParseError), result
    assert result.verb == Verb.SANDBOX
    assert says in result.message
    assert "Usage: `/ws sandbox " in result.message


def test_sandbox_help_shows_the_separator_and_the_repeatable_option() -> None:
    assert parse("sandbox --help") == parse("help sandbox") == parse("sandbox /r -h -- x") \
        == Help(Verb.SANDBOX)
    text = help_text(Verb.SANDBOX)
    assert "[--allow HOST]... [--team TEAM] -- COMMAND`" in text
    assert "/ws sandbox list" in text and "/ws sandbox show ID" in text
