"""The IDE in the browser, through the access proxy, on the whole local stack.

A stack as `stasis up` starts it (the IDE proxy is one of its processes), workspaces created
with the CLI as their owner would, and headless Chromium (Debian's, driven by Playwright)
carrying the portal's session cookie, issued with ``session.issue`` as the portal does after
its sign-in: JupyterLab loads at the workspace's ``url``, a cell run through its UI sets a
variable, the workspace is paused, the proxy's page resumes it ("Resume"), and the
variable is still there; nothing the browser receives carries the IDE's token; a VS Code
workspace's editor loads; removing the user from the team closes their kernel WebSocket
within two seconds. Screenshots land in test-artifacts/ide-proxy/.
"""

from __future__ import annotations

import contextlib
import json
import re
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import requests
import websocket
import yaml
from chromium_support import CHROMIUM, launched

from functions.portal import session
from runtime.local.host import code_server_command
from stack.portal import secret_path

pytestmark = pytest.mark.skipif(
    not CHROMIUM.exists(),
    reason="the IDE proxy's browser tests need the Debian package chromium at "
           "/usr/bin/chromium (apt-get install -y chromium)")
sync_api = pytest.importorskip(
    "playwright.sync_api", reason="the IDE proxy's browser tests need playwright")

ROOT = Path(__file__).resolve().parents[2]
ARTIFACTS = ROOT / "test-artifacts" / "ide-proxy"


@pytest.fixture(scope="module")
def stack(local_stack: Any) -> Any:
    return local_stack


@pytest.fixture(scope="module")
def browser() -> Iterator[Any]:
    yield from launched()


def _secret(stack: Any) -> bytes:
    """The stack's session secret: what the portal signs its cookies with."""
    return secret_path(stack.settings).read_text().strip().encode()


class Seen:
    """Everything a page received: response headers and text bodies, cookies, WebSocket
    frames."""

    def __init__(self, page: Any) -> None:
        self.texts: list[str] = []
        self.page = page
        page.on("response", self._response)
        page.on("websocket", lambda ws: ws.on(
            "framereceived", lambda frame: self.texts.append(str(frame))))

    def _response(self, response: Any) -> None:
        self.texts.append(json.dumps(response.headers))
        kind = response.headers.get("content-type", "")
        if response.status < 300 and any(t in kind for t in ("html", "json", "javascript")):
            # A body gone with a navigation: its headers were seen.
            with contextlib.suppress(Exception):
                self.texts.append(response.text())

    def carries(self, secret: str) -> bool:
        cookies = json.dumps(self.page.context.cookies())
        return secret in cookies or any(secret in text for text in self.texts)


def _page(browser: Any, stack: Any, user: str) -> Any:
    _, cookie = session.issue(user, _secret(stack), time.time())
    context = browser.new_context(viewport={"width": 1280, "height": 800})
    context.add_cookies([{"name": session.COOKIE, "value": cookie,
                          "url": stack.settings.ide_proxy_url, "httpOnly": True,
                          "sameSite": "Strict"}])
    return context.new_page()


def _status(stack: Any, name: str, user: str) -> dict[str, Any]:
    return dict(json.loads(stack.cli("ws", "status", name, "--team", "ml-a", "--json",
                                     user=user).stdout))


def _shot(page: Any, name: str) -> None:
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    page.screenshot(path=str(ARTIFACTS / f"{name}.png"))


def _run_cell(page: Any, code: str, expect: str) -> None:
    """Type into the notebook's last cell and run it (Shift+Enter) as a user would, once
    its kernel is connected (a cell run before that is dropped by JupyterLab)."""
    page.get_by_text(re.compile(r"Python 3 \(ipykernel\) \| Idle")).wait_for(timeout=120_000)
    editor = page.locator(".jp-NotebookPanel:not(.lm-mod-hidden) .jp-Cell .cm-content").last
    editor.click()
    page.keyboard.type(code)
    page.keyboard.press("Shift+Enter")
    try:
        page.locator(".jp-OutputArea-output").filter(has_text=expect).wait_for(timeout=120_000)
    except Exception:
        _shot(page, "cell-failed")
        raise


def test_jupyterlab_in_the_browser_keeps_its_variable_across_pause_and_resume(
        stack: Any, browser: Any) -> None:
    stack.cli("ws", "create", "lab", "--team", "ml-a", "--wait", user="bob")
    info = _status(stack, "lab", "bob")
    assert info["url"] == f"{stack.settings.ide_proxy_url}/w/ml-a--lab/"
    page = _page(browser, stack, "bob")
    seen = Seen(page)
    page.goto(info["url"])
    # The launcher's notebook card (JupyterLab gives it its kernel's name as title).
    page.get_by_title("Python 3 (ipykernel)").first.click()
    _run_cell(page, "x = 6 * 7\nprint('x is', x)", "x is 42")
    _shot(page, "lab-before-pause")

    stack.cli("ws", "pause", "lab", "--team", "ml-a", "--wait", user="bob")
    page.goto(info["url"])
    # (The pause may still be finishing: a "pausing" page reloads itself until it is.)
    page.get_by_role("heading", name="ml-a--lab is paused").wait_for(timeout=30_000)
    _shot(page, "paused")
    page.get_by_role("button", name="Resume").click()
    # The proxy's waiting page reloads itself until JupyterLab is back; the notebook, opened
    # again, finds its kernel restored (the node agent re-creates its session).
    page.locator(".jp-DirListing-item", has_text="Untitled.ipynb").dblclick(timeout=180_000)
    assert stack.workspace("ml-a--lab")["state"] == "RUNNING"
    _run_cell(page, "print('still', x)", "still 42")
    _shot(page, "lab-after-resume")

    token = _status(stack, "lab", "bob")["token"]
    assert token and not seen.carries(token), "the IDE's token reached the browser"
    assert not [c for c in page.context.cookies() if c["name"].startswith("username-")]
    resumes = [d.to_dict() for d in stack.db.collection("audit").stream()
               if (d.to_dict() or {}).get("action") == "workspace.resume_requested"]
    assert [r["actor"] for r in resumes] == ["bob"]
    page.context.close()


def test_another_teams_user_is_refused_and_no_session_is_sent_to_sign_in(stack: Any) -> None:
    url = f"{stack.settings.ide_proxy_url}/w/ml-a--lab/"
    carol = {session.COOKIE: session.issue("carol", _secret(stack), time.time())[1]}
    assert requests.get(url + "api/status", cookies=carol, timeout=30).status_code == 403
    with pytest.raises(websocket.WebSocketBadStatusException) as upgrade:
        websocket.create_connection(url.replace("http", "ws", 1) + "api/events/subscribe",
                                    header=[f"Cookie: {session.COOKIE}={carol[session.COOKIE]}"],
                                    timeout=30)
    assert upgrade.value.status_code == 403
    nobody = requests.get(url, headers={"Accept": "text/html"}, timeout=30)
    assert nobody.status_code == 401 and "stasis portal" in nobody.text


@pytest.mark.skipif(code_server_command() is None,
                    reason="code-server is not installed: `make setup` installs it under "
                           "build/code-server")
def test_a_vscode_workspace_opens_in_the_browser_and_its_editor_loads(
        stack: Any, browser: Any) -> None:
    stack.cli("ws", "create", "code", "--team", "ml-a", "--ide", "vscode", "--wait",
              user="bob")
    info = _status(stack, "code", "bob")
    page = _page(browser, stack, "bob")
    seen = Seen(page)
    page.goto(info["url"])
    page.locator(".monaco-workbench").wait_for(timeout=180_000)
    page.get_by_role("treeitem", name=re.compile(r"\.local")).first.wait_for(timeout=60_000)
    _shot(page, "vscode")
    assert info["token"] and not seen.carries(info["token"])
    assert not [c for c in page.context.cookies() if c["name"] == "code-server-session"]
    page.context.close()


def test_removing_the_user_from_the_team_closes_their_kernel_websocket_within_2s(
        stack: Any, browser: Any, tmp_path: Path) -> None:
    info = _status(stack, "lab", "bob")
    page = _page(browser, stack, "bob")
    page.goto(info["url"])
    page.locator("#jp-main-dock-panel").wait_for(timeout=120_000)
    sessions = page.evaluate("async () => (await fetch('api/sessions')).json()")
    channels = f"api/kernels/{sessions[0]['kernel']['id']}/channels"
    # A kernel WebSocket of the page's own, with the browser's cookies, timed in the page.
    page.evaluate("""url => new Promise((opened, failed) => {
        const ws = new WebSocket(new URL(url, location.href).href.replace(/^http/, 'ws'));
        ws.onopen = () => opened(true);
        ws.onerror = () => failed(new Error('no WebSocket'));
        ws.onclose = e => {
            window.kernelClosed = {at: Date.now(), code: e.code, reason: e.reason};
        };
    })""", channels)
    config = yaml.safe_load((ROOT / "examples" / "stasis.yaml").read_text())
    team = next(t for t in config["teams"] if t["id"] == "ml-a")
    team["members"] = [m for m in team["members"] if m["user"] != "bob"]
    without_bob = tmp_path / "without-bob.yaml"
    without_bob.write_text(yaml.safe_dump(config))
    stack.cli("admin", "apply", str(without_bob))
    page.wait_for_function("window.kernelClosed !== undefined", timeout=10_000)
    closed = page.evaluate("window.kernelClosed")
    assert (closed["code"], closed["reason"]) == (1008, "bob is not a member of team ml-a")
    # From the commit of the removal (the team document's update time, this machine's
    # clock as the page's) to the close the page saw.
    team = stack.db.collection("teams").document("ml-a").get()
    after = closed["at"] - team.update_time.timestamp() * 1000
    assert 0 < after < 2000, f"the kernel WebSocket was open {after:.0f} ms after the removal"
    print(f"closed {after:.0f} ms after the removal committed")
    assert requests.get(info["url"] + "api/status", timeout=30, cookies={
        session.COOKIE: session.issue("bob", _secret(stack), time.time())[1]}
    ).status_code == 403
    page.context.close()
