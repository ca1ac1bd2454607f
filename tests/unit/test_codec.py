"""The CloudEvent codec: every event type survives structured HTTP, binary HTTP and Pub/Sub;
anything that breaks the contract is an InvalidEvent whose reason says what and where.

Decoding must never raise anything but InvalidEvent: the delivery guard dead-letters an
InvalidEvent at once, while any other exception is retried as if it were temporary.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
from datetime import UTC, datetime, timedelta, timezone
from functools import cache
from pathlib import Path
from typing import Any

import pytest
from cloudevents.http import CloudEvent
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from events import (
    CATALOG,
    Event,
    InvalidEvent,
    LinkRevoked,
    SandboxFinished,
    UnknownEventType,
    WorkspaceReady,
    WorkspaceRequested,
    from_cloudevent,
    from_http,
    from_pubsub,
    new_event,
    to_cloudevent,
    to_http,
    to_pubsub,
)
from events.schemas import event_schema

GOLDEN_DIR = Path(__file__).resolve().parents[2] / "tests" / "data" / "events"
NAMES = sorted(CATALOG)
WHEN = datetime(2025, 6, 10, 14, 25, 0, 123456, tzinfo=UTC)
READY = WorkspaceReady("ml-a--ws", "http://127.0.0.1:8890/lab", "local:1")


@cache
def _golden_text(name: str) -> str:
    return (GOLDEN_DIR / f"{name}.json").read_text()


def _golden(name: str) -> dict[str, Any]:
    """A fresh copy of the golden payload of ``name``."""
    data: dict[str, Any] = json.loads(_golden_text(name))
    return data


def _payload(name: str) -> Any:
    return CATALOG[name].payload(**_golden(name))


def _event(name: str, **envelope: Any) -> Event[Any]:
    return new_event(_payload(name), **{"source": "//test", "subject": "subj-1", "id": "ev-1",
                                        "time": WHEN, "requestid": "req-1", **envelope})


def _same(a: Event[Any], b: Event[Any]) -> None:
    assert (b.payload, b.id, b.source, b.subject, b.time, b.requestid) == (
        a.payload, a.id, a.source, a.subject, a.time, a.requestid)


def _http(mode: str, event: Event[Any]) -> tuple[dict[str, str], bytes]:
    return to_http(event, mode)  # type: ignore[arg-type]


def _reason(call: Any, *args: Any) -> str:
    with pytest.raises(InvalidEvent) as caught:
        call(*args)
    return caught.value.reason


# -- round trips ---------------------------------------------------------------------------


@pytest.mark.parametrize("name", NAMES)
@pytest.mark.parametrize("mode", ["structured", "binary"])
def test_http_round_trip(name: str, mode: str) -> None:
    event = _event(name)
    headers, body = _http(mode, event)
    decoded = from_http(headers, body)
    _same(event, decoded)
    assert decoded.type == f"dev.stasis.{name}"
    assert decoded.name == name


@pytest.mark.parametrize("name", NAMES)
def test_http_headers_of_each_mode(name: str) -> None:
    event = _event(name)
    headers, body = to_http(event, "structured")
    assert headers["content-type"] == "application/cloudevents+json"
    envelope = json.loads(body)
    assert envelope["type"] == f"dev.stasis.{name}"
    assert envelope["requestid"] == "req-1"
    assert envelope["data"] == _golden(name)
    headers, body = to_http(event, "binary")
    assert headers["ce-type"] == f"dev.stasis.{name}"
    assert headers["ce-id"] == "ev-1"
    assert headers["ce-requestid"] == "req-1"
    assert json.loads(body) == _golden(name)


@pytest.mark.parametrize("name", NAMES)
def test_pubsub_round_trip(name: str) -> None:
    event = _event(name)
    data, attributes = to_pubsub(event)
    assert json.loads(data) == _golden(name)
    assert attributes["ce-type"] == f"dev.stasis.{name}"
    assert attributes["ce-specversion"] == "1.0"
    assert all(isinstance(v, str) for v in attributes.values())
    _same(event, from_pubsub(data, attributes))


@pytest.mark.parametrize("name", NAMES)
def test_cloudevent_round_trip(name: str) -> None:
    event = _event(name)
    cloudevent = to_cloudevent(event)
    assert cloudevent["type"] == f"dev.stasis.{name}"
    assert cloudevent["subject"] == "subj-1"
    _same(event, from_cloudevent(cloudevent))


@pytest.mark.parametrize("name", NAMES)
def test_every_field_survives(name: str) -> None:
    """Payloads compare equal field by field, types included (no 4 -> 4.0, [] -> ())."""
    event = _event(name)
    for decoded in (from_pubsub(*to_pubsub(event)), from_http(*to_http(event, "binary")),
                    from_http(*to_http(event, "structured"))):
        for field in dataclasses.fields(event.payload):
            want, got = getattr(event.payload, field.name), getattr(decoded.payload, field.name)
            assert (got, type(got)) == (want, type(want)), field.name


@pytest.mark.parametrize("when", [
    datetime(2025, 1, 1, tzinfo=UTC),
    datetime(2025, 6, 10, 14, 25, 0, 999999, tzinfo=UTC),
    datetime(2025, 6, 10, 16, 25, tzinfo=timezone(timedelta(hours=2))),
])
def test_time_survives_exactly(when: datetime) -> None:
    event = new_event(READY, time=when)
    for decoded in (from_pubsub(*to_pubsub(event)), from_http(*to_http(event, "binary")),
                    from_http(*to_http(event, "structured"))):
        assert decoded.time == when
        assert decoded.time.utcoffset() == when.utcoffset()


# -- the envelope --------------------------------------------------------------------------


def test_new_event_defaults() -> None:
    before = datetime.now(UTC)
    event = new_event(READY)
    assert event.requestid == event.id
    assert len(event.id) == 32 and int(event.id, 16) >= 0
    assert event.source == "//stasis"
    assert event.subject == "ml-a--ws"
    assert before <= event.time <= datetime.now(UTC)
    assert event.time.tzinfo is not None
    assert new_event(READY).id != event.id


def test_requestid_is_kept_when_given() -> None:
    event = new_event(READY, requestid="user-request-7", id="retry-2")
    assert (event.id, event.requestid) == ("retry-2", "user-request-7")
    for decoded in (from_pubsub(*to_pubsub(event)), from_http(*to_http(event, "binary")),
                    from_http(*to_http(event, "structured"))):
        assert decoded.requestid == "user-request-7"
        assert decoded.id == "retry-2"


def test_requestid_defaults_to_the_id_on_decode_too() -> None:
    data, attributes = to_pubsub(new_event(READY, id="ev-9"))
    del attributes["ce-requestid"]
    assert from_pubsub(data, attributes).requestid == "ev-9"


def test_a_given_id_makes_the_event_deterministic() -> None:
    a = new_event(READY, id="ws-v3", time=WHEN)
    b = new_event(READY, id="ws-v3", time=WHEN)
    assert a == b
    assert to_pubsub(a) == to_pubsub(b)


@pytest.mark.parametrize(("payload", "subject"), [
    (READY, "ml-a--ws"),
    (WorkspaceRequested("ml-a", "alice", "ws", "cpu-small"), "ml-a--ws"),
    (SandboxFinished("sbx-1", True), "sbx-1"),
    (LinkRevoked("lnk-1", "ml-a--ws", "bob"), "ml-a--ws"),
])
def test_default_subject(payload: Any, subject: str) -> None:
    assert new_event(payload).subject == subject


def test_missing_subject_and_time_on_decode() -> None:
    data, attributes = to_pubsub(new_event(READY, subject="elsewhere"))
    del attributes["ce-subject"], attributes["ce-time"]
    before = datetime.now(UTC)
    decoded = from_pubsub(data, attributes)
    assert decoded.subject == "ml-a--ws"
    assert decoded.time >= before


def test_zulu_and_naive_times_are_utc() -> None:
    data, attributes = to_pubsub(new_event(READY))
    zulu = from_pubsub(data, {**attributes, "ce-time": "2025-06-10T14:25:00Z"})
    naive = from_pubsub(data, {**attributes, "ce-time": "2025-06-10T14:25:00"})
    assert zulu.time == naive.time == datetime(2025, 6, 10, 14, 25, tzinfo=UTC)


def test_describe_is_log_safe() -> None:
    event = new_event(WorkspaceRequested("ml-a", "alice", "ws", "cpu-small",
                                         reply_to="secret-channel"), id="e", requestid="r")
    assert event.describe() == {"type": "dev.stasis.workspace.requested", "id": "e",
                                "subject": "ml-a--ws", "requestid": "r", "origin": ""}
    assert event.topic == "stasis-workspace-requested"


# -- invalid payloads, on encode and on decode ---------------------------------------------


def test_new_event_refuses_an_invalid_payload() -> None:
    reason = _reason(new_event, WorkspaceReady("not-an-id", "http://x", "h"))
    assert reason.startswith("workspace.ready: ")
    assert "/workspace_id" in reason


def test_every_encoder_refuses_an_invalid_payload() -> None:
    """An Event built by hand (skipping new_event) is still checked before it leaves."""
    event = dataclasses.replace(new_event(READY), payload=WorkspaceReady("ml-a--ws", "", "h"))
    for encode in (to_pubsub, to_cloudevent, lambda e: to_http(e, "binary"),
                   lambda e: to_http(e, "structured")):
        reason = _reason(encode, event)
        assert "workspace.ready" in reason and "/url" in reason


@pytest.mark.parametrize("name", NAMES)
def test_decoders_refuse_a_payload_without_a_required_field(name: str) -> None:
    field = event_schema(name)["required"][0]
    data = {k: v for k, v in _golden(name).items() if k != field}
    good = _event(name)
    _, attributes = to_pubsub(good)
    for reason in (
        _reason(from_pubsub, json.dumps(data).encode(), attributes),
        _reason(from_http, *_binary_with(good, data)),
        _reason(from_http, *_structured_with(good, data)),
    ):
        assert reason.startswith(f"{name}: ")
        assert f"'{field}'" in reason


@pytest.mark.parametrize("name", NAMES)
def test_decoders_refuse_a_field_of_the_wrong_type(name: str) -> None:
    field = event_schema(name)["required"][-1]
    data = {**_golden(name), field: {"not": "this"}}
    good = _event(name)
    _, attributes = to_pubsub(good)
    for reason in (
        _reason(from_pubsub, json.dumps(data).encode(), attributes),
        _reason(from_http, *_binary_with(good, data)),
        _reason(from_http, *_structured_with(good, data)),
    ):
        assert reason.startswith(f"{name}: ")
        assert f"/{field}" in reason


@pytest.mark.parametrize("name", NAMES)
def test_decoders_refuse_an_unknown_field(name: str) -> None:
    data = {**_golden(name), "password": "hunter2"}
    good = _event(name)
    _, attributes = to_pubsub(good)
    reason = _reason(from_pubsub, json.dumps(data).encode(), attributes)
    assert reason.startswith(f"{name}: ") and "'password'" in reason


def _binary_with(event: Event[Any], data: Any) -> tuple[dict[str, str], bytes]:
    headers, _ = to_http(event, "binary")
    return headers, json.dumps(data).encode()


def _structured_with(event: Event[Any], data: Any) -> tuple[dict[str, str], bytes]:
    headers, body = to_http(event, "structured")
    envelope = json.loads(body)
    envelope["data"] = data
    return headers, json.dumps(envelope).encode()


# -- messages that are not Stasis events ---------------------------------------------------


def test_unknown_type() -> None:
    data, attributes = to_pubsub(new_event(READY))
    attributes["ce-type"] = "dev.stasis.workspace.exploded"
    with pytest.raises(UnknownEventType, match=r"workspace\.exploded"):
        from_pubsub(data, attributes)
    headers, body = to_http(new_event(READY), "binary")
    headers["ce-type"] = "com.example.other"
    with pytest.raises(UnknownEventType, match=r"com\.example\.other"):
        from_http(headers, body)
    with pytest.raises(UnknownEventType):
        from_cloudevent(CloudEvent({"type": "workspace.ready.v2", "source": "s"}, {}))


def test_unknown_type_is_an_invalid_event() -> None:
    assert issubclass(UnknownEventType, InvalidEvent)


@pytest.mark.parametrize(("headers", "body"), [
    ({"content-type": "application/json"}, b'{"workspace_id": "ml-a--ws"}'),
    ({"content-type": "text/plain"}, b"hello"),
    ({}, b""),
    ({"content-type": "application/cloudevents+json"}, b"[1, 2]"),
    ({"content-type": "application/cloudevents+json"}, b"\xff\xfe"),
    ({"content-type": "application/cloudevents+json"}, b"[" * 100_000),
])
def test_a_body_that_is_not_a_cloudevent(headers: dict[str, str], body: bytes) -> None:
    reason = _reason(from_http, headers, body)
    assert reason.startswith("not a CloudEvent")


def test_a_pubsub_message_without_ce_type_is_not_a_cloudevent() -> None:
    data, attributes = to_pubsub(new_event(READY))
    del attributes["ce-type"]
    assert _reason(from_pubsub, data, attributes).startswith("not a CloudEvent")
    assert _reason(from_pubsub, data, {}).startswith("not a CloudEvent")


def test_an_unsupported_specversion_is_not_a_cloudevent() -> None:
    headers, body = to_http(new_event(READY), "binary")
    headers["ce-specversion"] = "0.9"
    assert _reason(from_http, headers, body).startswith("not a CloudEvent")


@pytest.mark.parametrize("data", [b"not json", b"\xff\xfe", b"{'single': 'quotes'}", b"",
                                  b"[" * 100_000, b"1" * 5000])
def test_pubsub_data_not_json(data: bytes) -> None:
    _, attributes = to_pubsub(new_event(READY))
    reason = _reason(from_pubsub, data, attributes)
    assert reason.startswith("dev.stasis.workspace.ready: data is not JSON")


@pytest.mark.parametrize("data", [b"[]", b'[{"workspace_id": "ml-a--ws"}]', b'"text"', b"7",
                                  b"null", b"true"])
def test_pubsub_data_not_an_object(data: bytes) -> None:
    _, attributes = to_pubsub(new_event(READY))
    reason = _reason(from_pubsub, data, attributes)
    assert reason.startswith("workspace.ready: data must be a JSON object")


def test_http_binary_data_not_json_or_a_list() -> None:
    headers, _ = to_http(new_event(READY), "binary")
    assert _reason(from_http, headers, b"not json").startswith(
        "dev.stasis.workspace.ready: data is not JSON")
    assert _reason(from_http, headers, b"[1]").startswith(
        "workspace.ready: data must be a JSON object, got list")


def test_http_structured_data_not_an_object_or_missing() -> None:
    event = new_event(READY)
    for data, kind in (([1], "list"), ("text", "str"), (None, "NoneType")):
        assert _reason(from_http, *_structured_with(event, data)).startswith(
            f"workspace.ready: data must be a JSON object, got {kind}")


def test_missing_ce_id() -> None:
    data, attributes = to_pubsub(new_event(READY))
    del attributes["ce-id"]
    assert _reason(from_pubsub, data, attributes) == "workspace.ready: the envelope has no id"
    headers, body = to_http(new_event(READY), "binary")
    del headers["ce-id"]
    _reason(from_http, headers, body)


def test_missing_ce_source() -> None:
    data, attributes = to_pubsub(new_event(READY))
    del attributes["ce-source"]
    assert _reason(from_pubsub, data, attributes) == (
        "workspace.ready: the envelope has no source")


def test_a_time_that_is_not_rfc_3339() -> None:
    data, attributes = to_pubsub(new_event(READY))
    reason = _reason(from_pubsub, data, {**attributes, "ce-time": "yesterday"})
    assert "yesterday" in reason and "RFC 3339" in reason
    headers, body = to_http(new_event(READY), "binary")
    assert "RFC 3339" in _reason(from_http, {**headers, "ce-time": "yesterday"}, body)


# -- anything at all: InvalidEvent or an event, nothing else ------------------------------

_JSON = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=20),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=10), inner,
                                                                max_size=4),
    max_leaves=12,
)


@st.composite
def _data_for(draw: st.DrawFn) -> tuple[str, dict[str, Any]]:
    """An event name and a dict: arbitrary keys, or the payload's own keys (some of them,
    maybe with a stray one) holding arbitrary or golden values."""
    name = draw(st.sampled_from(NAMES))
    golden = _golden(name)
    keys = list(golden)
    values = _JSON | st.sampled_from(list(golden.values()))
    own = draw(st.dictionaries(st.sampled_from(keys), values))
    base = draw(st.sampled_from([{}, golden]))
    stray = draw(st.dictionaries(st.text(max_size=10), _JSON, max_size=2))
    return name, {**base, **own, **stray}


def _decode_or_invalid(name: str, data: bytes) -> Event[Any] | None:
    _, attributes = to_pubsub(_event(name))
    try:
        return from_pubsub(data, attributes)
    except InvalidEvent:
        return None


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(_data_for())
def test_arbitrary_dicts_decode_or_raise_invalid_event(case: tuple[str, dict[str, Any]]) -> None:
    name, data = case
    decoded = _decode_or_invalid(name, json.dumps(data).encode())
    if decoded is not None:
        # What decodes is a payload of the right type holding exactly the data.
        assert decoded.name == name
        assert set(dataclasses.asdict(decoded.payload)) == set(_golden(name))
        for key, value in data.items():
            assert getattr(decoded.payload, key) == value or value != value  # NaN


@settings(max_examples=200, deadline=None)
@given(st.sampled_from(NAMES), st.binary(max_size=64))
def test_arbitrary_bytes_decode_or_raise_invalid_event(name: str, data: bytes) -> None:
    _decode_or_invalid(name, data)


@settings(max_examples=100, deadline=None)
@given(st.dictionaries(st.text(max_size=12), st.text(max_size=20), max_size=6))
def test_arbitrary_attributes_decode_or_raise_invalid_event(attributes: dict[str, str]) -> None:
    data, good = to_pubsub(new_event(READY))
    for attrs in (attributes, {**good, **attributes}):
        with contextlib.suppress(InvalidEvent):
            from_pubsub(data, attrs)


def test_the_origin_travels_as_a_cloudevents_extension() -> None:
    event = dataclasses.replace(new_event(WorkspaceRequested("ml-a", "alice", "ws",
                                                             "cpu-small")), origin="chat")
    data, attributes = to_pubsub(event)
    assert attributes["ce-origin"] == "chat"
    assert from_pubsub(data, attributes).origin == "chat"
    assert from_cloudevent(to_cloudevent(event)).origin == "chat"
    unpublished = to_pubsub(dataclasses.replace(event, origin=""))[1]
    assert "ce-origin" not in unpublished
