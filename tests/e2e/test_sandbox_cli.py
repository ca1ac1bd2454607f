"""A sandbox end to end on the local stack, driven through the `stasis` CLI as a user would:
request, queue and run (function host, Pub/Sub push, the node agent's runner), review the
patch, apply it to a checkout, see the failing test pass."""

from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path

from runtime.local.sandboxes import candidate_roots
from runtime.local.settings import AgentSettings

BUG = "def add(a, b):\n    return a - b\n"
TEST = ("import unittest\n\nfrom calc import add\n\n\nclass AddTest(unittest.TestCase):\n"
        "    def test_add(self):\n        self.assertEqual(add(2, 3), 5)\n")


def _git(repo: Path, *args: str) -> None:
    subprocess.run(["git", "-C", str(repo), "-c", "user.name=t", "-c", "user.email=t@t", *args],
                   check=True, capture_output=True)


def _passes(repo: Path) -> bool:
    return subprocess.run(["python3", "-m", "unittest", "-q"], cwd=repo, capture_output=True,
                          check=False).returncode == 0


def test_a_sandbox_fixes_a_failing_test_and_the_patch_is_applied_by_hand(local_stack, tmp_path):
    repo = tmp_path / "repo"
    repo.mkdir()
    _git(repo, "init", "-q", "-b", "main")
    (repo / "calc.py").write_text(BUG)
    (repo / "test_calc.py").write_text(TEST)
    _git(repo, "add", "-A")
    _git(repo, "commit", "-qm", "bug")
    try:
        out = local_stack.cli(
            "sandbox", "run", "--repo", str(repo), "--base", "main", "--wait", "--json",
            "--command", "sed -i 's/a - b/a + b/' calc.py && python3 -m unittest -q",
            timeout=240)
        doc = json.loads(out.stdout)
        assert doc["state"] == "SUCCEEDED" and doc["files_changed"] == ["calc.py"]
        assert doc["network"].startswith(("none:", "NOT ENFORCED"))
        sandbox_id = doc["id"]

        listed = local_stack.cli("sandbox", "list").stdout
        assert sandbox_id in listed and "SUCCEEDED" in listed
        shown = local_stack.cli("sandbox", "show", sandbox_id)
        assert "-    return a - b\n+    return a + b" in shown.stdout
        assert "state" in shown.stderr and "SUCCEEDED" in shown.stderr
        assert "\nOK" in local_stack.cli("sandbox", "show", sandbox_id, "--log").stdout

        checkout = tmp_path / "checkout"
        subprocess.run(["git", "clone", "-q", str(repo), str(checkout)], check=True)
        assert not _passes(checkout) and not _passes(repo)  # nothing applied on its own
        local_stack.cli("sandbox", "apply", sandbox_id, "--to", str(checkout), "--check")
        assert not _passes(checkout)
        applied = local_stack.cli("sandbox", "apply", sandbox_id, "--to", str(checkout))
        assert "applied" in applied.stdout and _passes(checkout)
    finally:
        settings = AgentSettings(data_dir=local_stack.settings.data_dir)
        for root in candidate_roots(settings, {}):
            shutil.rmtree(root, ignore_errors=True)


def test_a_refused_sandbox_says_why(local_stack, tmp_path):
    repo = tmp_path / "r"
    repo.mkdir()
    _git(repo, "init", "-q", "-b", "main")
    _git(repo, "commit", "-q", "--allow-empty", "-m", "empty")
    out = local_stack.cli("sandbox", "run", "--repo", str(repo), "--command", "true",
                          "--allow-network", "pypi.org", "--wait", check=False)
    assert out.returncode == 1
    assert "FAILED" in out.stdout and "network destinations not permitted" in out.stdout


def test_an_idle_sandbox_is_suspended_and_resumed_from_the_cli(local_stack, tmp_path):
    repo = tmp_path / "idle-repo"
    repo.mkdir()
    _git(repo, "init", "-q", "-b", "main")
    _git(repo, "commit", "-q", "--allow-empty", "-m", "empty")
    try:
        out = local_stack.cli(
            "sandbox", "run", "--repo", str(repo), "--base", "main", "--idle-seconds", "1",
            "--command", "echo first > a.txt; sleep 3; echo second > b.txt", "--wait",
            "--json", check=False, timeout=240)
        assert out.returncode == 5, out.stdout + out.stderr  # stopped at the suspension
        doc = json.loads(out.stdout)
        sandbox_id = doc["id"]
        assert doc["state"] == "SUSPENDED" and doc["reason"] == "suspended_idle"
        assert doc["limits"]["idle_seconds"] == 1 and doc["suspensions"] == 1
        assert f"stasis sandbox resume {sandbox_id}" in doc["message"]

        [line] = [x for x in local_stack.cli("sandbox", "list").stdout.splitlines()
                  if sandbox_id in x]
        assert "SUSPENDED" in line and "idle for" in line
        shown = local_stack.cli("sandbox", "show", sandbox_id)
        assert "+first" in shown.stdout and "+second" not in shown.stdout  # the checkpoint
        assert "checkpoint patch" in shown.stderr

        for _ in range(5):  # the rest of its sleep may idle it again
            out = local_stack.cli("sandbox", "resume", sandbox_id, "--wait", "--json",
                                  check=False, timeout=240)
            doc = json.loads(out.stdout)
            if doc["state"] != "SUSPENDED":
                break
        assert out.returncode == 0 and doc["state"] == "SUCCEEDED", doc["message"]
        assert sorted(doc["files_changed"]) == ["a.txt", "b.txt"]
        assert doc["suspended_at"] is None and doc["suspended_ms"] > 0

        again = local_stack.cli("sandbox", "resume", sandbox_id, check=False)
        assert again.returncode == 1 and "not suspended" in again.stderr
    finally:
        settings = AgentSettings(data_dir=local_stack.settings.data_dir)
        for root in candidate_roots(settings, {}):
            shutil.rmtree(root, ignore_errors=True)
