"""`stasis bundle`: the Cloud Functions source zip and the Terraform variables derived from the
code's tables (deploy/)."""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest
from click.testing import CliRunner

from deploy import bundle as zipped
from deploy import tfvars
from functions.routes import FUNCTIONS, HTTP_FUNCTIONS, IAP, PUBLIC, SCHEDULER, Http
from stasis_cli.main import main

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def built(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path, str]:
    """(zip, tfvars, output) of one `stasis bundle` run into a temporary directory."""
    tmp = tmp_path_factory.mktemp("bundle")
    out, generated = tmp / "stasis.zip", tmp / "env" / "stasis.auto.tfvars.json"
    result = CliRunner().invoke(
        main,
        ["bundle", "--out", str(out), "--tfvars", str(generated), "--env", "dev"],
        catch_exceptions=False,
    )
    assert result.exit_code == 0, result.output
    return out, generated, result.output


@pytest.fixture(autouse=True, scope="module")
def _no_generated_files_left() -> object:
    """The run above also writes terraform/environments/dev/stasis.auto.tfvars.json (as a
    deployer's would); put back whatever was there."""
    target = ROOT / "terraform" / "environments" / "dev" / tfvars.TFVARS_NAME
    before = target.read_bytes() if target.exists() else None
    yield
    if before is None:
        target.unlink(missing_ok=True)
    else:
        target.write_bytes(before)


@pytest.fixture(scope="module")
def plan() -> tfvars.Deployment:
    return tfvars.deployment()


HANDLER = "functions.handlers.scheduled:janitor"  # any handler: the tests deploy, never call


def test_zip_holds_the_packages_a_shim_and_requirements(built: tuple[Path, Path, str]) -> None:
    out, _, _ = built
    names = zipfile.ZipFile(out).namelist()
    assert {
        "main.py",
        "requirements.txt",
        "functions/main.py",
        "functions/routes.py",
        "events/payloads.py",
    } <= set(names)
    assert any(n.startswith("schemas/events/") and n.endswith(".json") for n in names)
    assert not any("__pycache__" in n or n.endswith(".pyc") for n in names)
    assert not any(n.startswith(("tests/", "stack/", "runtime/", "bench/", "deploy/"))
                   for n in names)
    shim = zipfile.ZipFile(out).read("main.py").decode()
    for entry in FUNCTIONS:
        assert f"    {entry}," in shim
    reqs = zipfile.ZipFile(out).read("requirements.txt").decode().split()
    names_only = {r.split("==")[0].lower() for r in reqs}
    assert {
        "functions-framework",
        "google-cloud-firestore",
        "google-cloud-pubsub",
        "cloudevents",
        "jsonschema",
    } <= names_only
    assert all("==" in r for r in reqs)  # the versions the tests ran against
    assert not names_only & {"jupyter-server", "jupyterlab", "ipykernel", "pytest"}


def test_the_bundle_imports_on_its_own(built: tuple[Path, Path, str], tmp_path: Path) -> None:
    """Cloud Functions imports main.py from the unpacked zip: every entry point must resolve
    there, without this checkout on the path."""
    out, _, _ = built
    zipfile.ZipFile(out).extractall(tmp_path)
    code = (
        "import sys\n"
        # The checkout itself (an editable install puts it on the path), not its venv.
        f"sys.path = [p for p in sys.path if p.rstrip('/') != {str(ROOT)!r}]\n"
        f"sys.path.insert(0, {str(tmp_path)!r})\n"
        "import main, functions\n"
        f"assert functions.__file__.startswith({str(tmp_path)!r}), functions.__file__\n"
        "print(','.join(sorted(n for n in main.__all__ if callable(getattr(main, n)))))\n"
    )
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    result = subprocess.run(
        [sys.executable, "-c", code],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=120,
        env=env,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    assert set(result.stdout.strip().split(",")) == set(FUNCTIONS)


def test_the_zip_is_deterministic(built: tuple[Path, Path, str], tmp_path: Path) -> None:
    """Same tree, same bytes: Terraform redeploys only when the code changed. (Two builds
    back to back: the tree is shared with people editing it.)"""
    out, generated, _ = built
    assert (
        json.loads(generated.read_text())["source_sha256"]
        == hashlib.sha256(out.read_bytes()).hexdigest()
    )
    reqs = zipped.requirements()
    first = zipped.build_zip(tmp_path / "a.zip", FUNCTIONS, reqs)
    second = zipped.build_zip(tmp_path / "b.zip", FUNCTIONS, reqs)
    assert first == second
    assert (tmp_path / "a.zip").read_bytes() == (tmp_path / "b.zip").read_bytes()


def test_tfvars_point_at_the_zip_relative_to_their_directory(built: tuple[Path, Path, str]) -> None:
    out, generated, output = built
    data = json.loads(generated.read_text())
    assert (generated.parent / data["source_archive"]).resolve() == out.resolve()
    assert set(data) == {
        "source_archive",
        "source_sha256",
        "event_topics",
        "max_delivery_attempts",
        "event_functions",
        "http_functions",
        "kubernetes",
        "firestore_indexes",
        "monitoring",
        "event_publishers",
    }
    assert "functions (" in output and "topics" in output and "composite indexes" in output


def test_a_new_http_function_is_one_line_deployed_as_declared() -> None:
    table = {**FUNCTIONS,
             "export_audit": Http("export_audit", SCHEDULER, HANDLER, schedule="0 3 * * *"),
             "reports": Http("reports", IAP, HANDLER),
             "ping": Http("ping", SCHEDULER, HANDLER)}
    plan = tfvars.deployment(table=table)
    assert plan.http_functions["export_audit"] == {
        "kind": "http", "access": "scheduler", "deploy_name": "stasis-export-audit",
        "account_id": "sx-export-audit", "schedule": "0 3 * * *"}
    assert plan.http_functions["reports"]["access"] == "iap"
    assert "schedule" not in plan.http_functions["reports"]
    assert plan.http_functions["ping"]["access"] == "scheduler"
    assert [w for w in plan.warnings if "ping" in w]  # no job: said, not guessed


def test_a_name_says_nothing_about_exposure() -> None:
    """Exposure is what the route declares: a function named like the chat one behind IAP
    is behind IAP, one named like a dashboard may be public."""
    table = {"slack_events": Http("slack_events", IAP, HANDLER),
             "dashboard_public": Http("dashboard_public", PUBLIC, HANDLER)}
    plan = tfvars.deployment(table=table)
    assert plan.http_functions["slack_events"]["access"] == "iap"
    assert plan.http_functions["dashboard_public"]["access"] == "public"
    assert plan.event_functions == {}


@pytest.mark.parametrize(
    ("name", "access", "schedule"),
    [
        ("chat", "public", None),
        ("dashboard", "iap", None),
        ("proxy", "iap", None),
        ("links", "iap", None),
        ("portal", "iap", None),
        ("reconcile", "scheduler", "*/10 * * * *"),
        ("janitor", "scheduler", "17 * * * *"),
        ("idle_sweep", "scheduler", "*/5 * * * *"),
        ("cost_rollup", "scheduler", "41 * * * *"),
    ],
)
def test_the_http_functions_keep_their_exposure_and_schedule(
    name: str, access: str, schedule: str | None, plan: tfvars.Deployment
) -> None:
    assert HTTP_FUNCTIONS[name].exposure == access
    assert HTTP_FUNCTIONS[name].schedule == schedule
    deployed = plan.http_functions[name]
    assert (deployed["access"], deployed.get("schedule")) == (access, schedule)


def test_check_only_checks(tmp_path: Path) -> None:
    result = CliRunner().invoke(main, ["bundle", "--check", "--out", str(tmp_path / "x.zip")])
    assert result.exit_code == 0, result.output
    assert f"{len(FUNCTIONS)} functions" in result.output
    assert not (tmp_path / "x.zip").exists()
