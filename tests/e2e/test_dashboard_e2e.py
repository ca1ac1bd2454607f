"""The admin dashboard on the local stack: mounted by the function host at /dashboard/, as
the dev identity, showing a workspace created through the CLI and its audit trail."""

from __future__ import annotations

import re

import requests


def test_the_function_host_serves_the_dashboard_with_the_fleet(null_stack):
    null_stack.cli("ws", "create", "dash", "--team", "ml-a", "--profile", "cpu-small", "--wait")
    base = f"{null_stack.settings.functions_url}/dashboard"

    fleet = requests.get(f"{base}/", timeout=60)
    assert fleet.status_code == 200, fleet.text
    assert "signed in as <b>dev</b> (dev identity)" in fleet.text
    assert 'data-row-id="ml-a--dash"' in fleet.text
    assert re.search(r'data-value="RUNNING" data-count="1"', fleet.text)
    assert "script-src" not in fleet.headers["Content-Security-Policy"]
    assert "<script" not in fleet.text

    audit = requests.get(f"{base}/audit", params={"workspace": "ml-a--dash"}, timeout=60)
    assert audit.status_code == 200
    actions = re.findall(r'data-action="([^"]+)"', audit.text)
    assert actions == ["workspace.ready", "workspace.requested"]

    latency = requests.get(f"{base}/latency", params={"team": "ml-a"}, timeout=60)
    assert re.search(r'<tr data-profile="cpu-small" data-n="1"', latency.text)
    assert requests.post(f"{base}/", timeout=60).status_code == 405
