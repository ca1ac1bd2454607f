"""The Alertmanager webhook's door (bearer token, never open), without I/O: ``Relay``
records what would be published onto the monitoring topic."""

from __future__ import annotations

import hmac
from typing import Any

import pytest

from functions.handlers import monitoring

TOKEN = "s3cr3t-0123456789abcdef"
BODY = b'{"version": "4", "alerts": []}'


class Relay:
    def __init__(self) -> None:
        self.bodies: list[bytes] = []

    def __call__(self, body: bytes) -> str:
        self.bodies.append(body)
        return "message-1"


@pytest.mark.parametrize("authorization", [
    None, "", "Bearer", f"Basic {TOKEN}", f"Bearer {TOKEN}x", f"Bearer {TOKEN[:-1]}",
    f"Token {TOKEN}", "Bearer  ", TOKEN,
])
def test_without_the_token_nothing_is_relayed(authorization: str | None) -> None:
    relay = Relay()
    body, status, headers = monitoring.webhook(authorization, BODY, TOKEN, relay)
    assert status == 401 and "Bearer" in body["error"]
    assert headers["WWW-Authenticate"].startswith("Bearer")
    assert relay.bodies == []


def test_a_webhook_without_a_configured_token_is_never_open() -> None:
    relay = Relay()
    for token in (None, ""):
        body, status, _ = monitoring.webhook(f"Bearer {TOKEN}", BODY, token, relay)
        assert status == 503 and "STASIS_ALERTMANAGER_TOKEN" in body["error"]
        _, status, _ = monitoring.webhook("Bearer ", BODY, token, relay)
        assert status == 503
    assert relay.bodies == []


@pytest.mark.parametrize("authorization", [f"Bearer {TOKEN}", f"bearer {TOKEN}",
                                           f"Bearer {TOKEN} "])
def test_with_the_token_the_body_is_relayed_unchanged(authorization: str) -> None:
    relay = Relay()
    assert monitoring.webhook(authorization, BODY, TOKEN, relay) == (
        {"relayed": "message-1"}, 202, {})
    assert relay.bodies == [BODY]


def test_the_token_is_compared_in_constant_time(monkeypatch: pytest.MonkeyPatch) -> None:
    compared: list[tuple[Any, Any]] = []
    original = hmac.compare_digest

    def compare(a: Any, b: Any) -> bool:
        compared.append((a, b))
        return original(a, b)

    monkeypatch.setattr(monitoring.hmac, "compare_digest", compare)
    monitoring.webhook("Bearer nope", BODY, TOKEN, Relay())
    assert compared == [(b"nope", TOKEN.encode())]


def test_an_oversized_body_is_refused() -> None:
    relay = Relay()
    big = b"x" * (monitoring.MAX_WEBHOOK_BYTES + 1)
    assert monitoring.webhook(f"Bearer {TOKEN}", big, TOKEN, relay)[1] == 413
    assert relay.bodies == []


def test_the_function_reads_the_header_and_body_of_the_request() -> None:
    class Request:
        headers = {"Authorization": f"Bearer {TOKEN}"}

        def get_data(self) -> bytes:
            return BODY

    relay = Relay()
    assert monitoring.serve_webhook(Request(), monitoring.Relay(TOKEN, relay))[1] == 202
    assert relay.bodies == [BODY]
