"""The /ws grammar as a table: text -> Command, Help or ParseError (with what to type)."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from functions.chatops.grammar import (
    VERBS,
    Command,
    Help,
    ParseError,
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
