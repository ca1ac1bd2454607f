"""The `stasis` command against a running stack (null runtime): `stasis status` says where
everything is, and the shared `--as` and `--json` work on verbs that lacked them."""

from __future__ import annotations

import json
from pathlib import Path

import requests

from functions.routes import HTTP_FUNCTIONS

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "stasis.yaml"


def test_status_shows_the_project_every_service_and_every_http_function(null_stack):
    settings = null_stack.settings
    view = json.loads(null_stack.cli("status", "--json").stdout)
    assert view["project"] == settings.project
    assert view["data_dir"] == str(settings.data_dir)
    services = {row["name"]: row for row in view["services"]}
    assert {"firestore", "pubsub", "gcs", "functions", "slack-sink", "scheduler"} <= \
        set(services)
    assert all(row["healthy"] and row["state"] == "running" for row in services.values())
    assert services["functions"]["url"] == settings.functions_url
    assert services["scheduler"]["address"] == settings.address("scheduler")
    # Every HTTP function of routes.py, on the function host, at the URL shown.
    assert {name: e["url"] for name, e in view["endpoints"].items()} == {
        name: f"{settings.functions_url}/{name}/" for name in HTTP_FUNCTIONS}
    dashboard = requests.get(view["endpoints"]["dashboard"]["url"], timeout=60)
    assert dashboard.status_code == 200 and "signed in as <b>dev</b>" in dashboard.text

    text = null_stack.cli("status").stdout
    assert f"project {settings.project}, data dir {settings.data_dir}" in text
    assert f"functions   {settings.address('functions'):<22} running  healthy" in text
    assert f"  links        {settings.functions_url + '/links/':<42} iap" in text


def test_as_acts_as_that_user_where_it_was_missing_or_ignored(null_stack):
    # alice's only team is ml-a: without --team her workspace lands there, as hers.
    null_stack.cli("ws", "create", "alices", "--as", "alice", "--wait")
    rows = json.loads(null_stack.cli("ws", "list", "--team", "ml-a", "--json",
                                     "--as", "alice").stdout)
    assert {r["name"]: r["owner"] for r in rows}["alices"] == "alice"
    # Verbs that read a sandbox or a job by id take --as and --json too now.
    missing = null_stack.cli("sandbox", "show", "sbx-none", "--as", "alice", check=False)
    assert missing.returncode == 1 and "no sandbox sbx-none" in missing.stderr
    assert "No such option" not in missing.stderr
    jobs = null_stack.cli("jobs", "list", "--as", "alice", "--json")
    assert json.loads(jobs.stdout) == []


def test_admin_apply_answers_json(null_stack):
    applied = json.loads(null_stack.cli("admin", "apply", str(EXAMPLE), "--json",
                                        "--as", "alice").stdout)
    assert applied["applied"] is True and len(applied["revision"]) == 64
    audit = [d.to_dict() for d in null_stack.db.collection("audit").stream()]
    assert any(a["action"] == "admin.apply" and a["actor"] == "alice" for a in audit)
