"""functions/routes.py is the one table: main.py's entry points, what bootstrap hands each
handler, and the HTTP functions' faces (functions/handlers/scheduled.py,
functions/chatops/web.py) follow from it."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import functions_framework
import pytest
from functions_framework import _function_registry

from events import CATALOG
from functions import bootstrap, main
from functions.chatops import web as chat_web
from functions.handlers import scheduled
from functions.portal import web as portal_web
from functions.routes import (
    FUNCTIONS,
    HTTP_FUNCTIONS,
    IAP,
    PUBLIC,
    ROUTES,
    SCHEDULER,
    Http,
    Raw,
    Route,
    _table,
)


def _handler(*args: Any) -> Any:
    return args


_probe = _handler


def test_the_table_is_split_by_trigger_and_names_are_unique() -> None:
    assert set(ROUTES) | set(HTTP_FUNCTIONS) == set(FUNCTIONS)
    assert not set(ROUTES) & set(HTTP_FUNCTIONS)
    assert all(isinstance(r, Route | Raw) for r in ROUTES.values())
    assert all(isinstance(r, Http) for r in HTTP_FUNCTIONS.values())
    with pytest.raises(ValueError, match="two functions named chat"):
        _table(Http("chat", PUBLIC, "m:f"), Http("chat", IAP, "m:f"))


def test_a_route_names_an_event_of_the_catalog_and_derives_its_names() -> None:
    with pytest.raises(ValueError, match=r"'workspace\.exploded', which events/ does not"):
        Route("on_workspace_exploded", "workspace.exploded", _handler)
    route = ROUTES["on_workspace_requested"]
    assert route.topic == CATALOG["workspace.requested"].topic
    assert route.subscription == "stasis-on-workspace-requested-push"
    assert route.dead_letter_topic == "stasis-dlq-on-workspace-requested"
    assert route.dead_letter_subscription == "stasis-dlq-on-workspace-requested-pull"
    assert route.ordered and not ROUTES["on_workspace_ready"].ordered


def test_a_raw_route_takes_its_own_topic_and_is_named_like_any_route(
        monkeypatch: pytest.MonkeyPatch) -> None:
    raw = ROUTES["on_monitoring"]
    assert isinstance(raw, Raw) and raw.event is None and not raw.ordered
    assert raw.topic == "stasis-monitoring" and raw.topic not in {
        spec.topic for spec in CATALOG.values()}
    assert raw.subscription == "stasis-on-monitoring-push"
    assert raw.dead_letter_subscription == "stasis-dlq-on-monitoring-pull"
    # bootstrap hands a raw route the message itself, under the same guard.
    calls: list[tuple[Any, ...]] = []
    monkeypatch.setattr(bootstrap, "_deliver_raw", lambda *a: calls.append(a))
    monkeypatch.setattr(bootstrap, "deps", lambda: "deps")
    bootstrap.deliver("on_monitoring", "a cloud event")
    assert calls == [("a cloud event", "on_monitoring", raw.handler, "deps")]


def test_only_a_scheduler_only_function_has_a_schedule() -> None:
    with pytest.raises(ValueError, match="export: only a scheduler-only function"):
        Http("export", IAP, "m:f", schedule="0 3 * * *")
    assert Http("export", SCHEDULER, "m:f").schedule is None
    with pytest.raises(ValueError, match="the handler is 'module:function'"):
        Http("export", SCHEDULER, "functions.handlers.scheduled.janitor")


def test_every_http_handler_resolves_and_gets_what_bootstrap_provides() -> None:
    for name, route in HTTP_FUNCTIONS.items():
        assert callable(route.load()), name
        assert route.deps in bootstrap._PROVIDERS, name
    assert HTTP_FUNCTIONS["portal"].load() is portal_web.handle


def test_a_cold_start_imports_no_front_door() -> None:
    """Every function's instance imports main.py; the front doors' modules (pages,
    templates, the proxy) come only with their own function's first request."""
    front_doors = ("functions.dashboard.web", "functions.portal.web", "functions.proxy.wiring",
                   "functions.chatops.web", "functions.handlers.scheduled")
    code = ("import sys, functions.main\n"
            f"print([m for m in {front_doors!r} if m in sys.modules])")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         check=True, cwd=Path(main.__file__).parents[1]).stdout
    assert out.strip() == "[]"


def test_main_has_one_entry_point_per_function_registered_under_its_name() -> None:
    assert sorted(main.__all__) == sorted(FUNCTIONS)
    for name in FUNCTIONS:
        assert getattr(main, name).__name__ == name
    expected = {**dict.fromkeys(ROUTES, "cloudevent"), **dict.fromkeys(HTTP_FUNCTIONS, "http")}
    assert {n: _function_registry.REGISTRY_MAP[n] for n in FUNCTIONS} == expected


@pytest.mark.parametrize("name", sorted(FUNCTIONS))
def test_functions_framework_serves_each_target_of_main_py(
    name: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """What `functions-framework --target NAME --source functions/main.py` does: a request
    (an HTTP call, or a pushed CloudEvent) reaches bootstrap under the function's name."""
    calls: list[tuple[str, str]] = []
    monkeypatch.setattr(bootstrap, "deliver", lambda n, ce: calls.append((n, ce["type"])))
    monkeypatch.setattr(bootstrap, "serve",
                        lambda n, req: calls.append((n, req.method)) or {"ok": True})
    client = functions_framework.create_app(target=name, source=main.__file__).test_client()
    if name in HTTP_FUNCTIONS:
        assert client.get("/").status_code == 200
        assert calls == [(name, "GET")]
    else:
        headers = {"ce-id": "1", "ce-source": "test", "ce-type": "dev.stasis.test",
                   "ce-specversion": "1.0", "Content-Type": "application/json"}
        assert client.post("/", headers=headers, data="{}").status_code == 200
        assert calls == [(name, "dev.stasis.test")]


def test_entry_points_hand_over_to_bootstrap(monkeypatch: pytest.MonkeyPatch) -> None:
    calls: list[tuple[str, Any]] = []
    monkeypatch.setattr(bootstrap, "deliver", lambda name, ce: calls.append((name, ce)))
    monkeypatch.setattr(bootstrap, "serve", lambda name, req: calls.append((name, req)) or 7)
    main.on_workspace_ready("ce")
    assert main.janitor("request") == 7
    assert calls == [("on_workspace_ready", "ce"), ("janitor", "request")]


def test_bootstrap_provides_what_every_http_route_asks_for(monkeypatch: pytest.MonkeyPatch
                                                            ) -> None:
    given: list[Any] = []
    deps = object()
    monkeypatch.setitem(HTTP_FUNCTIONS, "probe", Http("probe", SCHEDULER,
                                                      f"{__name__}:_probe", deps="probe"))
    monkeypatch.setitem(bootstrap._PROVIDERS, "probe", lambda: deps)
    monkeypatch.setattr(sys.modules[__name__], "_probe", lambda req, d: given.append((req, d)))
    bootstrap.serve("probe", "request")
    assert given == [("request", deps)]


# --- the HTTP faces ----------------------------------------------------------------------------
def _request(method: str = "POST", **args: str) -> Any:
    return SimpleNamespace(method=method, args=args)


def test_chat_refuses_to_serve_unverified_and_warms_up_on_get() -> None:
    warmed: list[bool] = []
    unconfigured = chat_web.ChatFront(None, lambda: warmed.append(True),
                                      problem="set STASIS_SLACK_SIGNING_SECRET")
    assert chat_web.serve(_request(), unconfigured) == (
        {"error": "set STASIS_SLACK_SIGNING_SECRET"}, 503)
    assert warmed == []
    front = chat_web.ChatFront(lambda req: ("acked", req.method), lambda: warmed.append(True))
    assert chat_web.serve(_request("GET"), front) == {"ok": True} and warmed == [True]
    assert chat_web.serve(_request("POST"), front) == ("acked", "POST")


def test_the_janitor_refuses_an_unknown_mode() -> None:
    body, status = scheduled.janitor(_request(mode="sweep-everything"), None)  # type: ignore[arg-type]
    assert status == 400 and "unknown mode 'sweep-everything'" in body["error"]
    assert "report" in body["error"] and "fix" in body["error"]


def test_the_cost_rollup_answers_a_bad_team_with_400(monkeypatch: pytest.MonkeyPatch) -> None:
    def refuse(deps: Any, *, team: str | None, write: bool) -> Any:
        raise ValueError(f"no team {team}")

    monkeypatch.setattr(scheduled.cost, "rollup", refuse)
    assert scheduled.cost_rollup(_request(team="nope"), deps=None) == (  # type: ignore[arg-type]
        {"error": "no team nope"}, 400)


def test_the_idle_sweep_passes_dry_run(monkeypatch: pytest.MonkeyPatch) -> None:
    seen: list[bool] = []
    monkeypatch.setattr(scheduled.idle, "sweep",
                        lambda deps, *, dry_run: seen.append(dry_run) or {"paused": []})
    scheduled.idle_sweep(_request(dry_run="1"), deps=None)  # type: ignore[arg-type]
    scheduled.idle_sweep(_request(), deps=None)  # type: ignore[arg-type]
    assert seen == [True, False]
