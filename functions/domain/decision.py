"""The one shape of a decision, whichever family it is about (workspaces, sandboxes, jobs).

A decision says whether the event changed anything (``accepted``) and why (``reason``, a
named reason; ``message``, the same in words for people), what must happen once it is
committed (``commands``: frozen dataclasses, carried out by
``functions.handlers.commands``) and what it tells the rest of the system (``events``: the
family's ``<family>.state_changed`` payloads, each with a deterministic ``event_id``).
``outcome()`` is what its ledger entry keeps for whoever waits on the request (the CLI's
``--wait``, a link's sandbox call). Each family's ``Decision`` adds what it writes (the
workspace, the sandbox records and queue, the job and the team's usage).

The transition pipeline (``functions.handlers.pipeline``) reads nothing else of a decision.
"""

from __future__ import annotations

from typing import Any, Protocol

from events.payloads import JobStateChanged, SandboxStateChanged, WorkspaceStateChanged

StateChanged = WorkspaceStateChanged | SandboxStateChanged | JobStateChanged


class Decided(Protocol):
    @property
    def accepted(self) -> bool: ...

    @property
    def reason(self) -> str: ...

    @property
    def message(self) -> str: ...

    @property
    def commands(self) -> tuple[Any, ...]: ...

    @property
    def events(self) -> tuple[StateChanged, ...]: ...

    def outcome(self) -> dict[str, Any]: ...
