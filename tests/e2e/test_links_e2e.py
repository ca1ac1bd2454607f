"""Agent links end to end on the local stack: a real workspace, a real kernel.

`stasis link create` as the user; `stasis exec --link` as the agent, run with an
environment that holds nothing but the link (no emulator, project or stack variables), so
it can only get in through the access proxy. Then the workspace is paused and the agent
runs again: the proxy resumes it and the kernel's state is back.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parents[2]
TOKENS: list[str] = []

COUNT = """
import time
for i in range(3):
    print("tick", i, flush=True)
    time.sleep(0.7)
answer = 41
"""


def _link(stack: Any, name: str, *extra: str) -> dict[str, Any]:
    body = json.loads(stack.cli("link", "create", name, "--team", "ml-a", "--json",
                                *extra).stdout)
    TOKENS.append(body["token"])
    return dict(body)


def _agent_env(url: str) -> dict[str, str]:
    """Nothing but the link (and what any process needs)."""
    return {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "HOME": os.environ.get("HOME", "/"),
            "STASIS_LINK": url}


def _exec(url: str, *args: str, timeout: float = 240) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "stasis_cli", "exec", *args], env=_agent_env(url),
                          capture_output=True, text=True, timeout=timeout, cwd=ROOT)


def _streaming(url: str, code: str) -> tuple[subprocess.Popen[str], list[tuple[float, str]]]:
    """Start `stasis exec CODE` and collect its stdout lines with their arrival times."""
    proc = subprocess.Popen([sys.executable, "-m", "stasis_cli", "exec", code], env=_agent_env(url),
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=ROOT)
    lines: list[tuple[float, str]] = []

    def read() -> None:
        assert proc.stdout is not None
        for line in proc.stdout:
            lines.append((time.monotonic(), line.rstrip("\n")))

    threading.Thread(target=read, daemon=True).start()
    return proc, lines


@pytest.fixture(scope="module")
def workspace(local_stack: Any) -> Iterator[str]:
    local_stack.cli("ws", "create", "agent", "--team", "ml-a", "--wait")
    yield "agent"


def test_an_agent_runs_code_through_a_link_and_a_paused_workspace_resumes(
        local_stack: Any, workspace: str, tmp_path: Path) -> None:
    stack = local_stack
    link = _link(stack, workspace, "--ttl", "30m")
    assert link["url"] == f"{stack.settings.functions_url}/proxy/ml-a--agent#{link['token']}"

    # Output streams while the cell runs, and the exit status is the cell's.
    proc, lines = _streaming(link["url"], COUNT)
    assert proc.wait(timeout=120) == 0, proc.stderr.read() if proc.stderr else ""
    ended = time.monotonic()
    stack.wait_for(lambda: len(lines) == 3, timeout=5, what="three ticks")
    assert [text for _, text in lines] == ["tick 0", "tick 1", "tick 2"]
    assert ended - lines[0][0] > 1.0, "tick 0 arrived only at the end: not streamed"

    script = tmp_path / "check.py"
    script.write_text("import sys\nprint(answer + 1)\nprint('to stderr', file=sys.stderr)\n")
    started = time.monotonic()
    done = _exec(link["url"], "-f", str(script))
    print(f"stasis exec -f on a running workspace: {time.monotonic() - started:.2f}s")
    assert (done.returncode, done.stdout, done.stderr) == (0, "42\n", "to stderr\n")

    failed = _exec(link["url"], "1 / 0")
    assert failed.returncode == 1 and "ZeroDivisionError" in failed.stderr

    # Paused: the agent's next request resumes it and waits; the kernel state is back.
    stack.cli("ws", "pause", workspace, "--team", "ml-a", "--wait")
    assert stack.workspace("ml-a--agent")["state"] == "PAUSED"
    started = time.monotonic()
    resumed = _exec(link["url"], "print(answer + 1)")
    print(f"exec on a paused workspace (resume included): {time.monotonic() - started:.1f}s")
    assert resumed.returncode == 0, resumed.stderr
    assert resumed.stdout == "42\n"
    assert "paused: resuming it" in resumed.stderr and "is running" in resumed.stderr
    doc = stack.workspace("ml-a--agent")
    assert doc["state"] == "RUNNING" and doc["last_resume_ms"] > 0
    audit = [d.to_dict() for d in stack.db.collection("audit").stream()]
    resumes = [a for a in audit if a["action"] == "workspace.resume_requested"]
    assert [a["actor"] for a in resumes] == [f"dev (link {link['link_id']})"]
    assert sum(a["action"] == "link.exec" for a in audit) == 4


def test_a_read_link_reads_the_jupyter_api_and_cannot_execute(local_stack: Any,
                                                               workspace: str) -> None:
    import requests

    from functions.domain.links import parse_link_url

    link = _link(local_stack, workspace, "--scope", "read")
    address = parse_link_url(link["url"])
    auth = {"Authorization": f"Bearer {address.token}"}
    sessions = requests.get(f"{address.workspace_url}/api/sessions", headers=auth, timeout=30)
    assert sessions.status_code == 200 and isinstance(sessions.json(), list)
    refused = _exec(link["url"], "print(1)")
    assert refused.returncode == 3 and "insufficient_scope" in refused.stderr


def test_revoking_a_link_stops_the_running_cell_within_a_second(local_stack: Any,
                                                                  workspace: str) -> None:
    stack = local_stack
    link = _link(stack, workspace)
    loop = ("import time\ncounter = 0\nwhile True:\n    counter += 1\n"
            "    print(counter, flush=True)\n    time.sleep(0.1)\n")
    proc, lines = _streaming(link["url"], loop)
    stack.wait_for(lambda: len(lines) >= 3, timeout=60, what="the loop to print")
    stack.cli("link", "revoke", link["link_id"])
    revoked_at = time.monotonic()
    assert proc.wait(timeout=10) == 3
    closed_after = lines[-1][0] - revoked_at  # no output arrives after the close
    assert closed_after < 1.0, f"output kept coming {closed_after:.2f}s after the revoke"
    print(f"last output {closed_after:.2f}s after the revoke returned")
    assert proc.stderr is not None and "revoked" in proc.stderr.read()
    assert _exec(link["url"], "print(1)").returncode == 3
    listed = stack.cli("link", "list", workspace, "--team", "ml-a", "--all").stdout
    row = next(line for line in listed.splitlines() if link["link_id"] in line)
    assert "revoked" in row and link["token"] not in listed

    # The cell itself was interrupted, not just the stream.
    fresh = _link(stack, workspace)
    first = _exec(fresh["url"], "print(counter)")
    time.sleep(0.5)
    second = _exec(fresh["url"], "print(counter)")
    assert first.returncode == second.returncode == 0
    assert first.stdout == second.stdout, "the loop kept running after the revoke"


def test_no_token_in_any_log_or_document(local_stack: Any) -> None:
    assert TOKENS, "run with the tests above"
    logs = {path.name: path.read_text(errors="replace")
            for path in local_stack.settings.log_dir.glob("*.log")}
    assert logs.get("functions.log"), "the function host logged nothing"
    db = local_stack.db

    def walk(collections: Any) -> Iterator[dict[str, Any]]:
        for collection in collections:
            for snap in collection.stream():
                yield {"_path": snap.reference.path, **(snap.to_dict() or {})}
                yield from walk(snap.reference.collections())

    documents = json.dumps(list(walk(db.collections())), default=str)
    assert '"_path": "links/' in documents
    for token in TOKENS:
        for name, text in logs.items():
            assert token not in text, f"a link token is in {name}"
        assert token not in documents, "a link token is stored in Firestore"
