"""Encode and decode Stasis events: CloudEvents (structured and binary HTTP) and Pub/Sub.

Built on the CloudEvents SDK. On Pub/Sub the data is the JSON payload and the attributes
follow the CloudEvents Pub/Sub binding (``ce-type``, ``ce-id``, ``ce-source``,
``ce-subject``, ``ce-time``, ``ce-requestid``, ``ce-specversion``, and ``ce-origin`` once a
bus has published it), so the same message is a CloudEvent for Eventarc and a plain message
for any subscriber. Every payload is validated
against its JSON Schema on encode and on decode; a violation raises InvalidEvent whose
``reason`` names the event type and the offending field.
"""

from __future__ import annotations

import dataclasses
import json
import uuid
from collections.abc import Mapping
from datetime import UTC, datetime
from typing import Any, Literal, TypeVar

from cloudevents.conversion import to_binary as _ce_to_binary
from cloudevents.conversion import to_structured as _ce_to_structured
from cloudevents.exceptions import GenericException as _CloudEventError
from cloudevents.http import CloudEvent
from cloudevents.http import from_http as _ce_from_http

from events.envelope import Event, InvalidEvent, UnknownEventType
from events.payloads import EventSpec, spec_for
from events.schemas import validate_payload

P = TypeVar("P")

DEFAULT_SOURCE = "//stasis"
_ATTR_PREFIX = "ce-"


def new_event(
    payload: P,
    *,
    source: str = DEFAULT_SOURCE,
    subject: str | None = None,
    requestid: str | None = None,
    id: str | None = None,
    time: datetime | None = None,
) -> Event[P]:
    """Wrap a payload in a fresh envelope, validating it.

    ``subject`` defaults to the payload's workspace (or sandbox) id; ``requestid`` defaults
    to the event id (a new user request); ``id`` may be given to make a derived event
    deterministic, so publishing it twice is harmless.
    """
    _validate(spec_for(payload), _payload_dict(payload))
    event_id = id or uuid.uuid4().hex
    return Event(
        payload=payload,
        id=event_id,
        source=source,
        subject=subject or _default_subject(payload),
        time=time or datetime.now(UTC),
        requestid=requestid or event_id,
    )


def to_cloudevent(event: Event[Any]) -> CloudEvent:
    data = _payload_dict(event.payload)
    _validate(spec_for(event.payload), data)
    attributes = {
        "type": event.type,
        "source": event.source,
        "id": event.id,
        "subject": event.subject,
        "time": event.time.isoformat(),
        "datacontenttype": "application/json",
        "requestid": event.requestid,
    }
    if event.origin:
        attributes["origin"] = event.origin
    return CloudEvent(attributes, data)


def from_cloudevent(cloudevent: CloudEvent) -> Event[Any]:
    """The Stasis event inside a CloudEvent; raises InvalidEvent with a reason."""
    attrs = cloudevent.get_attributes()
    type_ = str(attrs.get("type", ""))
    try:
        spec = spec_for(type_)
    except KeyError:
        raise UnknownEventType(f"unknown event type {type_!r}") from None
    data = cloudevent.get_data()
    if isinstance(data, (bytes, bytearray)):
        data = _json(bytes(data), type_)
    return _build(spec, data, attrs)


def to_http(
    event: Event[Any], mode: Literal["structured", "binary"] = "structured"
) -> tuple[dict[str, str], bytes]:
    cloudevent = to_cloudevent(event)
    converter = _ce_to_structured if mode == "structured" else _ce_to_binary
    headers, body = converter(cloudevent)
    return dict(headers), body if isinstance(body, bytes) else str(body).encode()


def from_http(headers: Mapping[str, str], body: bytes) -> Event[Any]:
    """Decode an HTTP CloudEvent (either mode); anything else raises InvalidEvent."""
    try:
        cloudevent = _ce_from_http(dict(headers), body)
    except (_CloudEventError, RecursionError) as exc:
        # RecursionError: a structured body nested too deep for json.loads.
        raise InvalidEvent(f"not a CloudEvent: {exc}") from None
    return from_cloudevent(cloudevent)


def to_pubsub(event: Event[Any]) -> tuple[bytes, dict[str, str]]:
    """The Pub/Sub message (data, attributes) for an event."""
    data = _payload_dict(event.payload)
    _validate(spec_for(event.payload), data)
    attributes = {
        "ce-specversion": "1.0",
        "ce-type": event.type,
        "ce-id": event.id,
        "ce-source": event.source,
        "ce-subject": event.subject,
        "ce-time": event.time.isoformat(),
        "ce-requestid": event.requestid,
        "content-type": "application/json",
    }
    if event.origin:
        attributes["ce-origin"] = event.origin
    return json.dumps(data, separators=(",", ":")).encode(), attributes


def from_pubsub(data: bytes, attributes: Mapping[str, str]) -> Event[Any]:
    """Decode a Pub/Sub message written by ``to_pubsub``; raises InvalidEvent."""
    type_ = attributes.get("ce-type")
    if not type_:
        raise InvalidEvent("not a CloudEvent: the message has no ce-type attribute")
    try:
        spec = spec_for(type_)
    except KeyError:
        raise UnknownEventType(f"unknown event type {type_!r}") from None
    attrs = {k[len(_ATTR_PREFIX):]: v for k, v in attributes.items() if k.startswith(_ATTR_PREFIX)}
    return _build(spec, _json(data, type_), attrs)


def _build(spec: EventSpec, data: Any, attrs: Mapping[str, Any]) -> Event[Any]:
    for required in ("id", "source"):
        if not attrs.get(required):
            raise InvalidEvent(f"{spec.name}: the envelope has no {required}")
    if not isinstance(data, dict):
        raise InvalidEvent(f"{spec.name}: data must be a JSON object, got {type(data).__name__}")
    _validate(spec, data)
    payload = spec.payload(**data)
    event_id = str(attrs["id"])
    return Event(
        payload=payload,
        id=event_id,
        source=str(attrs["source"]),
        subject=str(attrs.get("subject") or _default_subject(payload)),
        time=_parse_time(attrs.get("time")),
        requestid=str(attrs.get("requestid") or event_id),
        origin=str(attrs.get("origin") or ""),
    )


def _validate(spec: EventSpec, data: Mapping[str, Any]) -> None:
    problem = validate_payload(spec.name, data)
    if problem is not None:
        raise InvalidEvent(f"{spec.name}: {problem}")


def _payload_dict(payload: Any) -> dict[str, Any]:
    return dataclasses.asdict(payload)


def _default_subject(payload: Any) -> str:
    for name in ("workspace_id", "sandbox_id", "link_id", "snapshot_id"):
        value = getattr(payload, name, None)
        if value:
            return str(value)
    return str(getattr(payload, "team", "stasis"))


def _json(data: bytes, type_: str) -> Any:
    try:
        return json.loads(data)
    except (ValueError, UnicodeDecodeError, RecursionError) as exc:
        # RecursionError: nested too deep to parse; permanent, so dead-letter, never retry.
        raise InvalidEvent(f"{type_}: data is not JSON ({exc})") from None


def _parse_time(value: Any) -> datetime:
    if isinstance(value, datetime):
        return value
    if not value:
        return datetime.now(UTC)
    try:
        parsed = datetime.fromisoformat(str(value).replace("Z", "+00:00"))
    except ValueError:
        raise InvalidEvent(f"the envelope time {value!r} is not RFC 3339") from None
    return parsed if parsed.tzinfo else parsed.replace(tzinfo=UTC)
