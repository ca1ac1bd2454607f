"""The browser session shared by the portal and the IDE access proxy."""

from __future__ import annotations

import pytest

from functions.portal import session

SECRET = b"s" * 32
NOW = 1_800_000_000.0


def test_a_session_round_trips() -> None:
    issued, cookie = session.issue("alice", SECRET, NOW)
    assert session.verify(cookie, SECRET, NOW + 10) == issued
    assert issued.user == "alice" and issued.expires_at == int(NOW) + session.MAX_AGE_SECONDS


@pytest.mark.parametrize("when", [NOW - 1, NOW + session.MAX_AGE_SECONDS])
def test_outside_its_lifetime_it_is_refused(when: float) -> None:
    _, cookie = session.issue("alice", SECRET, NOW)
    assert session.verify(cookie, SECRET, when) is None


def test_a_forged_or_resigned_cookie_is_refused() -> None:
    _, cookie = session.issue("alice", SECRET, NOW)
    _, bob = session.issue("bob", SECRET, NOW)
    body, mac = cookie.split(".")
    assert session.verify(f"{bob.split('.')[0]}.{mac}", SECRET, NOW) is None
    assert session.verify(cookie, b"other-secret", NOW) is None
    assert session.verify(f"{body}.", SECRET, NOW) is None
    assert session.verify("garbage", SECRET, NOW) is None
    assert session.verify(None, SECRET, NOW) is None


def test_csrf_tokens_belong_to_one_session() -> None:
    alice, _ = session.issue("alice", SECRET, NOW)
    other, _ = session.issue("alice", SECRET, NOW)
    token = session.csrf_token(alice, SECRET)
    assert session.csrf_ok(alice, SECRET, token)
    assert not session.csrf_ok(other, SECRET, token)
    assert not session.csrf_ok(alice, SECRET, None)
    assert not session.csrf_ok(alice, b"x" * 32, token)


def test_no_secret_no_session() -> None:
    with pytest.raises(ValueError, match="STASIS_SESSION_SECRET"):
        session.issue("alice", b"", NOW)
    _, cookie = session.issue("alice", SECRET, NOW)
    assert session.verify(cookie, b"", NOW) is None
