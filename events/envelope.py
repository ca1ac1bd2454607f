"""The envelope around a payload: id, source, subject, time, the request id and the origin.

``requestid`` stays the same across retries of one user request, so consumers can make a
retried request have one effect even when its event id is new. ``origin`` names the
component that published it (``functions.domain.publishers``): the publisher sets it (the
bus adapters stamp their own component), and the delivery guard refuses an event whose
origin may not send its type.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import Any, Generic, TypeVar

from events.payloads import spec_for

P = TypeVar("P")


class InvalidEvent(ValueError):
    """An event that breaks the contract; ``reason`` says how, for the dead-letter record."""

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


class UnknownEventType(InvalidEvent):
    """A CloudEvent whose type is not one of Stasis's."""


@dataclass(frozen=True)
class Event(Generic[P]):
    """One event: a payload in its CloudEvents envelope."""

    payload: P
    id: str
    source: str
    subject: str
    time: datetime
    requestid: str
    #: The publishing component ("" until a bus publishes it).
    origin: str = ""

    @property
    def name(self) -> str:
        return spec_for(self.payload).name

    @property
    def type(self) -> str:
        return spec_for(self.payload).ce_type

    @property
    def topic(self) -> str:
        return spec_for(self.payload).topic

    def describe(self) -> dict[str, Any]:
        """A short, log-safe description (no payload values)."""
        return {"type": self.type, "id": self.id, "subject": self.subject,
                "requestid": self.requestid, "origin": self.origin}
