"""Agent sandboxes through their two new front doors on the whole local stack: a signed
`/ws sandbox` (`stasis chat`, which follows the Slack sink for the notification) and an
agent holding nothing but a link (HTTP with its token). Function host, Pub/Sub push,
the node agent's runner and fake-gcs-server are all real; the patches fix a failing test."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import time
from pathlib import Path
from typing import Any

import requests

from functions.domain.links import DEFAULT_POLICY
from runtime.local.sandboxes import candidate_roots
from runtime.local.settings import AgentSettings

FIX = "sed -i 's/a - b/a + b/' calc.py"


def _git(repo: Path, *args: str) -> None:
    subprocess.run(["git", "-C", str(repo), "-c", "user.name=t", "-c", "user.email=t@t", *args],
                   check=True, capture_output=True)


def _passes(repo: Path) -> bool:
    return subprocess.run(["python3", "-m", "unittest", "-q"], cwd=repo, capture_output=True,
                          check=False).returncode == 0


def _repo(tmp: Path) -> Path:
    repo = tmp / "calc"
    repo.mkdir()
    _git(repo, "init", "-q", "-b", "main")
    (repo / "calc.py").write_text("def add(a, b):\n    return a - b\n")
    (repo / "test_calc.py").write_text(
        "import unittest\n\nfrom calc import add\n\n\nclass AddTest(unittest.TestCase):\n"
        "    def test_add(self):\n        self.assertEqual(add(2, 3), 5)\n")
    _git(repo, "add", "-A")
    _git(repo, "commit", "-qm", "bug")
    return repo


def _applies(repo: Path, patch: str, where: Path) -> bool:
    subprocess.run(["git", "clone", "-q", str(repo), str(where)], check=True)
    (where.parent / f"{where.name}.patch").write_text(patch)
    _git(where, "apply", "--binary", str(where.parent / f"{where.name}.patch"))
    return _passes(where)


def test_a_sandbox_from_slack_and_one_from_an_agents_link(local_stack: Any,
                                                          tmp_path: Path) -> None:
    stack = local_stack
    repo = _repo(tmp_path)
    try:
        # Slack: the ack, then (followed on the sink) the notification of the end.
        out = stack.cli("chat", f"/ws sandbox {repo} --ref main -- {FIX}", "--as", "alice",
                        "--timeout", "240", timeout=300).stdout
        match = re.search(r"Sandbox `(sbx-[0-9a-f]{16})` is running", out)
        assert match, out
        sandbox_id = match.group(1)
        assert f"Sandbox `{sandbox_id}` (`{FIX}`) ended *SUCCEEDED*" in out, out
        assert f"stasis sandbox apply {sandbox_id} --to CHECKOUT" in out
        shown = stack.cli("sandbox", "show", sandbox_id).stdout
        assert _applies(repo, shown, tmp_path / "from-slack")

        # An agent with nothing but a sandbox-scoped link.
        stack.cli("ws", "create", "nb", "--team", "ml-a", "--profile", "cpu-small", "--wait",
                  timeout=240)
        link = json.loads(stack.cli("link", "create", "nb", "--team", "ml-a", "--scope",
                                    "sandbox", "--json").stdout)
        base, _, token = link["url"].partition("#")
        agent = requests.Session()
        agent.trust_env = False
        agent.headers["Authorization"] = f"Bearer {token}"
        posted = agent.post(f"{base}/stasis/sandboxes", timeout=60, json={
            "repository": str(repo), "base_ref": "main", "command": FIX})
        assert posted.status_code == 201, posted.text
        assert posted.json()["state"] in ("RUNNING", "QUEUED")
        url = f"{base}/stasis/sandboxes/{posted.json()['sandbox_id']}"
        deadline = time.monotonic() + 240
        while (view := agent.get(url, timeout=30).json())["state"] not in (
                "SUCCEEDED", "FAILED", "TIMED_OUT", "KILLED") and time.monotonic() < deadline:
            time.sleep(0.5)
        assert (view["state"], view["requester"], view["files_changed"]) == (
            "SUCCEEDED", "dev", ["calc.py"]), view
        assert _applies(repo, view["patch"], tmp_path / "from-link")
        assert agent.post(f"{base}/execute", json={"code": "1"}, timeout=30).status_code == 403

        stack.cli("link", "revoke", link["link_id"])
        # The revoking worker forgets the link at once; another function worker may have
        # it cached for at most the policy's cache_seconds.
        revoked = time.monotonic()
        while (status := agent.get(url, timeout=30).status_code) == 200 and (
                time.monotonic() - revoked < 5):
            time.sleep(0.05)
        waited = time.monotonic() - revoked
        assert status == 401 and waited < DEFAULT_POLICY.cache_seconds + 0.5, (status, waited)
        dead = json.loads(stack.cli("dlq", "--json").stdout)
        assert [d for d in dead if d["consumer"] in (
            "notify_chat_sandbox", "on_sandbox_requested", "on_sandbox_finished")] == []
        assert not _passes(repo)  # nothing was applied on its own
    finally:
        stack.cli("ws", "delete", "nb", "--team", "ml-a", check=False)
        settings = AgentSettings(data_dir=stack.settings.data_dir)
        for root in candidate_roots(settings, {}):
            shutil.rmtree(root, ignore_errors=True)
