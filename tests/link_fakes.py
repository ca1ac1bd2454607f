"""Small fakes for the link tests (unit and integration): a kernel gateway that plays a
script of kernel messages and records interrupts, a bus that records, an adjustable clock.

Importable from any test module (``tests/`` is on sys.path through its conftest).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any

from functions.proxy.ports import Forwarded, GatewayError, KernelChoice, Server


class Clock:
    """An adjustable wall clock (for expiry): ``clock()`` is now plus the offset."""

    def __init__(self, start: datetime | None = None) -> None:
        self.base = start or datetime.now(UTC)
        self.offset = timedelta()
        self.real = start is None

    def __call__(self) -> datetime:
        now = datetime.now(UTC) if self.real else self.base
        return now + self.offset

    def advance(self, seconds: float) -> None:
        self.offset += timedelta(seconds=seconds)


@dataclass
class FakeExecution:
    """A cell: ``script`` is a list of messages, or a callable giving the next one (None:
    nothing yet). Ends with ``done`` unless the script is endless."""

    script: Any
    status: str = "ok"
    real_time: bool = False
    interrupted: threading.Event = field(default_factory=threading.Event)
    closed: threading.Event = field(default_factory=threading.Event)
    position: int = 0

    def next(self, timeout: float) -> dict[str, Any] | None:
        if self.interrupted.is_set():
            raise GatewayError("interrupted")
        if callable(self.script):
            message = self.script(self)
            if message is None and self.real_time:
                time.sleep(min(timeout, 0.05))
            return message
        if self.position < len(self.script):
            self.position += 1
            return dict(self.script[self.position - 1])
        return {"type": "done", "status": self.status, "execution_count": 1}

    def interrupt(self) -> None:
        self.interrupted.set()

    def close(self) -> None:
        self.closed.set()


class FakeGateway:
    """The KernelGateway port: one server per running workspace, scripted cells."""

    def __init__(self, cell: Callable[[str], FakeExecution] | None = None) -> None:
        self.cell = cell or (lambda code: FakeExecution([
            {"type": "stream", "name": "stdout", "text": f"ran {len(code)} bytes\n"}]))
        self.executions: list[FakeExecution] = []
        self.forwarded: list[tuple[str, str, str, bytes]] = []
        self.down = False

    def server(self, workspace_id: str, version: int) -> Server | None:
        return None if self.down else Server(f"http://127.0.0.1:1/{workspace_id}", "jt")

    def choose_kernel(self, server: Server, *, notebook: str | None,
                      kernel_id: str | None) -> KernelChoice:
        return KernelChoice(kernel_id or "k-1", notebook or "stasis-agent.ipynb")

    def execute(self, server: Server, kernel_id: str, code: str) -> FakeExecution:
        execution = self.cell(code)
        self.executions.append(execution)
        return execution

    def forward(self, server: Server, method: str, path: str, query: str, body: bytes,
                content_type: str | None) -> Forwarded:
        self.forwarded.append((method, path, query, body))
        return Forwarded(200, "application/json", b'{"forwarded": true}')


class RecordingBus:
    def __init__(self, on_publish: Callable[[Any], None] | None = None) -> None:
        self.events: list[Any] = []
        self.on_publish = on_publish
        self.fail = False

    def publish(self, event: Any) -> str:
        if self.fail:
            raise RuntimeError("pubsub down")
        self.events.append(event)
        if self.on_publish:
            self.on_publish(event)
        return str(len(self.events))


def ticking(period: float = 0.05) -> Callable[[FakeExecution], dict[str, Any] | None]:
    """An endless cell printing a line every ``period`` seconds (real time)."""
    state = {"last": 0.0, "n": 0}

    def step(execution: FakeExecution) -> dict[str, Any] | None:
        now = time.monotonic()
        if now - state["last"] >= period:
            state["last"] = now
            state["n"] += 1
            return {"type": "stream", "name": "stdout", "text": f"tick {state['n']}\n"}
        time.sleep(min(period, 0.02))
        return None

    return step


class MemoryLinkStore:
    """The LinkStore port in memory: links by token hash, teams, workspaces, audit."""

    def __init__(self) -> None:
        self.links: dict[str, Any] = {}
        self.uses: dict[str, int] = {}
        self.teams: dict[str, list[dict[str, Any]]] = {}
        self.workspaces: dict[str, Any] = {}
        self.audits: list[dict[str, Any]] = []
        self.outcomes: dict[str, dict[str, Any]] = {}
        self.reads = 0

    def get_link(self, token_hash: str) -> Any:
        self.reads += 1
        return self.links.get(token_hash)

    def find_link(self, link_id: str) -> Any:
        return next(((h, link) for h, link in self.links.items() if link.link_id == link_id),
                    None)

    def list_links(self, *, workspace: str | None = None, team: str | None = None,
                   creator: str | None = None) -> list[Any]:
        return [(link, {"uses": self.uses.get(h, 0), "last_used_at": None})
                for h, link in self.links.items()
                if (workspace is None or link.workspace == workspace)
                and (team is None or link.team == team)
                and (creator is None or link.creator == creator)]

    def count_active(self, workspace: str, now: datetime) -> int:
        return sum(1 for link, _ in self.list_links(workspace=workspace)
                   if link.status(now) == "active")

    def create_link(self, token_hash: str, link: Any, audit: Any) -> None:
        assert token_hash not in self.links
        self.links[token_hash] = link
        self.audits.append(dict(audit))

    def revoke_link(self, token_hash: str, decide: Any, audit: Any) -> Any:
        result = decide(self.links.get(token_hash))
        if not hasattr(result, "reason"):
            self.links[token_hash] = result
            self.audits.append(dict(audit(result)))
        return result

    def team_members(self, team: str) -> Any:
        return self.teams.get(team)

    def target(self, workspace_id: str) -> Any:
        return self.workspaces.get(workspace_id)

    def read_many(self, token_hashes: Any, teams: Any, workspaces: Any) -> Any:
        self.reads += len(token_hashes)
        return ({h: self.links.get(h) for h in token_hashes},
                {t: self.teams.get(t) for t in teams},
                {w: self.workspaces.get(w) for w in workspaces})

    def record_uses(self, uses: Any, now: datetime) -> None:
        for h, n in uses.items():
            self.uses[h] = self.uses.get(h, 0) + n

    def audit(self, entry: Any) -> None:
        self.audits.append(dict(entry))

    def resume_outcome(self, event: Any) -> Any:
        return self.outcomes.get(event.requestid)


class MemorySandboxResults:
    """The SandboxResults port in memory: sandbox documents, the handler's verdicts by
    request id (set by a test, e.g. from a bus hook), objects by ``gs://`` URI."""

    def __init__(self) -> None:
        self.docs: dict[str, dict[str, Any]] = {}
        self.outcomes: dict[str, dict[str, Any]] = {}
        self.objects: dict[str, bytes] = {}
        self.asked_outcome = 0

    def sandbox(self, sandbox_id: str) -> Any:
        return self.docs.get(sandbox_id)

    def list_sandboxes(self, team: str, requester: str, limit: int = 50) -> list[Any]:
        return [d for d in self.docs.values()
                if d.get("team") == team and d.get("requester") == requester][:limit]

    def request_outcome(self, event: Any) -> Any:
        self.asked_outcome += 1
        return self.outcomes.get(event.requestid)

    def read_object(self, uri: str, *, limit: int, tail: bool = False) -> tuple[bytes, bool]:
        if uri not in self.objects:
            raise FileNotFoundError(uri)
        data = self.objects[uri]
        return (data[-limit:] if tail else data[:limit]), len(data) > limit
