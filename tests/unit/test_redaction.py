"""The one redaction function (``functions/domain/redaction.py``) and the places that show
sandbox tasks through it: chat, the portal, the links proxy, the CLI (the dashboard's are in
test_dashboard.py)."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from functions.chatops import replies
from functions.domain.redaction import redact
from functions.portal import views

SECRET = "ghp_s3cretVALUE"


@pytest.mark.parametrize(("text", "shown"), [
    (f"https://alice:{SECRET}@github.com/org/repo.git", "https://***@github.com/org/repo.git"),
    (f"https://{SECRET}@github.com/org/repo.git", "https://***@github.com/org/repo.git"),
    ("git@github.com:org/repo.git", "git@github.com:org/repo.git"),  # no credential in it
    (f"make test --token={SECRET}", "make test --token=***"),
    (f"tool --password '{SECRET} x' -v", "tool --password *** -v"),
    (f"deploy --api-key {SECRET}", "deploy --api-key ***"),
    (f'curl -H "Authorization: Bearer {SECRET}" https://h/x',
     'curl -H "Authorization: Bearer ***" https://h/x'),
    (f"Proxy-Authorization: Basic {SECRET}", "Proxy-Authorization: Basic ***"),
    (f"GITHUB_TOKEN={SECRET} make", "GITHUB_TOKEN=*** make"),
    (f'DB_PASSWORD="{SECRET} y" ./run', "DB_PASSWORD=*** ./run"),
    (f"https://h/x?access_token={SECRET}&page=2", "https://h/x?access_token=***&page=2"),
    ("echo stasis_" + "A" * 43, "echo stasis_***"),
    # Not credentials: kept as typed.
    ("pytest -k token_test --tokenizer=gpt2", "pytest -k token_test --tokenizer=gpt2"),
    ("MY_TOKENIZER=bpe make", "MY_TOKENIZER=bpe make"),
    ("", ""),
])
def test_redact(text: str, shown: str) -> None:
    assert redact(text) == shown


@given(st.text(max_size=200))
def test_redact_is_idempotent_and_never_raises(text: str) -> None:
    once = redact(text)
    assert redact(once) == once


def test_anything_not_text_is_shown_as_text() -> None:
    assert redact(None) == "" and redact(3) == "3"


TASK = {"id": "sb-1", "team": "ml-a", "requester": "alice", "state": "FAILED",
        "repository": f"https://alice:{SECRET}@github.com/org/repo.git",
        "command": f"make test --token={SECRET}", "base_ref": "main",
        "message": f"git clone https://alice:{SECRET}@github.com/org/repo.git failed"}


def test_chat_shows_tasks_redacted() -> None:
    assert SECRET not in replies.sandbox_ack("sb-1", {**TASK, "state": "RUNNING"})
    assert SECRET not in replies.sandbox_status(TASK)


def test_the_portal_shows_tasks_redacted() -> None:
    from datetime import UTC, datetime

    row = views.sandbox_row(TASK, datetime.now(UTC))
    assert SECRET not in str(row)
    assert row["repository"] == "https://***@github.com/org/repo.git"
