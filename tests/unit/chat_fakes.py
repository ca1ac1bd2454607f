"""Small fakes of the chat ports that record what they were asked (unit tests only)."""

from __future__ import annotations

from collections.abc import Mapping
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import yaml

from functions.chatops.ports import ChatDeps, NotifyRefused
from functions.chatops.replies import RESPONSE_URL_TTL, RESPONSE_URL_USES
from functions.domain.catalog import Catalog
from functions.domain.lifecycle import State, Workspace

ROOT = Path(__file__).resolve().parents[2]
CATALOG = Catalog.from_config(yaml.safe_load((ROOT / "examples" / "stasis.yaml").read_text()))
NOW = datetime(2026, 5, 4, 12, 0, tzinfo=UTC)


def workspace(name: str, team: str = "ml-a", owner: str = "alice",
              state: State = State.RUNNING, version: int = 3, profile_: str = "cpu-small",
              **kw: Any) -> Workspace:
    return Workspace(id=f"{team}--{name}", team=team, owner=owner, name=name,
                     profile=profile_, state=state, version=version, **kw)


class FakeStore:
    """ChatReads and ChatRecords in memory."""

    def __init__(self, *workspaces: Workspace) -> None:
        self.workspaces = {w.id: w for w in workspaces}
        self.docs: dict[tuple[str, str], dict[str, Any]] = {}
        self.records: dict[str, dict[str, Any]] = {}
        self.marks: dict[str, dict[str, Any]] = {}

    def get_workspace(self, workspace_id: str) -> Workspace | None:
        return self.workspaces.get(workspace_id)

    def list_workspaces(self, *, team: str | None = None, states: Any = None,
                        limit: int = 500) -> list[Workspace]:
        return [w for w in self.workspaces.values() if team is None or w.team == team]

    def get(self, collection: str, doc_id: str) -> dict[str, Any] | None:
        return self.docs.get((collection, doc_id))

    def snapshots(self, workspace_id: str) -> list[dict[str, Any]]:
        return [{"id": k[1], **v} for k, v in self.docs.items()
                if k[0] == "snapshots" and v.get("workspace") == workspace_id]

    def list_sandboxes(self, team: str, limit: int = 200) -> list[dict[str, Any]]:
        return [v for k, v in self.docs.items()
                if k[0] == "sandboxes" and v.get("team") == team][:limit]

    def remember(self, requestid: str, record: Mapping[str, Any]) -> None:
        self.records.setdefault(requestid, dict(record))

    def recall(self, requestid: str) -> dict[str, Any] | None:
        return self.records.get(requestid)

    def use_response_url(self, requestid: str, now: datetime) -> bool:
        record = self.records.get(requestid)
        if (not record or not record.get("response_url")
                or record["response_url_uses"] >= RESPONSE_URL_USES
                or now - record["issued_at"] >= RESPONSE_URL_TTL):
            return False
        record["response_url_uses"] += 1
        return True

    def notified(self, key: str) -> bool:
        return key in self.marks

    def claim_notification(self, key: str, detail: Mapping[str, Any], now: datetime) -> bool:
        if key in self.marks:
            return False
        self.marks[key] = dict(detail)
        return True

    def release_notification(self, key: str) -> None:
        self.marks.pop(key, None)

    def mark_notified(self, key: str, detail: Mapping[str, Any], now: datetime) -> None:
        self.marks[key] = dict(detail)


class FakeBus:
    def __init__(self, fail: bool = False) -> None:
        self.published: list[Any] = []
        self.fail = fail

    def publish(self, event: Any) -> str:
        if self.fail:
            raise ConnectionError("pubsub down")
        self.published.append(event)
        return str(len(self.published))


class FakeNotifier:
    def __init__(self, *, url_works: bool = True, refuse: str | None = None) -> None:
        self.responded: list[tuple[str, dict[str, Any]]] = []
        self.posted: list[tuple[str, dict[str, Any]]] = []
        self.url_works = url_works
        self.refuse = refuse

    def respond(self, response_url: str, message: Mapping[str, Any]) -> bool:
        if not self.url_works:
            return False
        self.responded.append((response_url, dict(message)))
        return True

    def post(self, channel: str, message: Mapping[str, Any]) -> None:
        if self.refuse:
            raise NotifyRefused(self.refuse)
        self.posted.append((channel, dict(message)))


def chat_deps(*workspaces: Workspace, bus: FakeBus | None = None,
              notifier: FakeNotifier | None = None, now: datetime = NOW,
              catalog: Catalog = CATALOG) -> ChatDeps:
    store = FakeStore(*workspaces)
    return ChatDeps(reads=store, records=store, notifier=notifier or FakeNotifier(),
                    bus=bus or FakeBus(), catalog=lambda: catalog, clock=lambda: now)
