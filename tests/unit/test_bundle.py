"""`stasis bundle`: the Cloud Functions source zip and the Terraform variables derived from the
code (stack/cli_bundle.py)."""

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

from stack import cli_bundle
from stack.cli import main

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def built(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path, str]:
    """(zip, tfvars, output) of one `stasis bundle` run into a temporary directory."""
    tmp = tmp_path_factory.mktemp("bundle")
    out, tfvars = tmp / "stasis.zip", tmp / "env" / "stasis.auto.tfvars.json"
    result = CliRunner().invoke(
        main,
        ["bundle", "--out", str(out), "--tfvars", str(tfvars), "--env", "dev"],
        catch_exceptions=False,
    )
    assert result.exit_code == 0, result.output
    return out, tfvars, result.output


@pytest.fixture(autouse=True, scope="module")
def _no_generated_files_left() -> object:
    """The run above also writes terraform/environments/dev/stasis.auto.tfvars.json (as a
    deployer's would); put back whatever was there."""
    target = ROOT / "terraform" / "environments" / "dev" / cli_bundle.TFVARS_NAME
    before = target.read_bytes() if target.exists() else None
    yield
    if before is None:
        target.unlink(missing_ok=True)
    else:
        target.write_bytes(before)


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
    assert not any(n.startswith(("tests/", "stack/", "runtime/", "bench/")) for n in names)
    shim = zipfile.ZipFile(out).read("main.py").decode()
    for entry in cli_bundle.entry_points():
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
    assert set(result.stdout.strip().split(",")) == set(cli_bundle.entry_points())


def test_the_zip_is_deterministic(built: tuple[Path, Path, str], tmp_path: Path) -> None:
    """Same tree, same bytes: Terraform redeploys only when the code changed. (Two builds
    back to back: the tree is shared with people editing it.)"""
    out, tfvars, _ = built
    assert (
        json.loads(tfvars.read_text())["source_sha256"]
        == hashlib.sha256(out.read_bytes()).hexdigest()
    )
    entries, reqs = cli_bundle.entry_points(), cli_bundle.requirements()
    first = cli_bundle.build_zip(tmp_path / "a.zip", entries, reqs)
    second = cli_bundle.build_zip(tmp_path / "b.zip", entries, reqs)
    assert first == second
    assert (tmp_path / "a.zip").read_bytes() == (tmp_path / "b.zip").read_bytes()


def test_tfvars_point_at_the_zip_relative_to_their_directory(built: tuple[Path, Path, str]) -> None:
    out, tfvars, output = built
    data = json.loads(tfvars.read_text())
    assert (tfvars.parent / data["source_archive"]).resolve() == out.resolve()
    assert set(data) == {
        "source_archive",
        "source_sha256",
        "event_topics",
        "max_delivery_attempts",
        "event_functions",
        "http_functions",
        "kubernetes",
    }
    assert "functions (" in output and "topics" in output


def test_a_cloud_event_entry_point_without_a_route_is_refused(tmp_path: Path) -> None:
    main_py = tmp_path / "main.py"
    main_py.write_text(
        (ROOT / "functions" / "main.py").read_text()
        + (
            "\n\n@functions_framework.cloud_event\n"
            "def on_something_new(cloud_event):  # type: ignore[no-untyped-def]\n"
            "    bootstrap.deliver('on_something_new', cloud_event)\n"
        )
    )
    with pytest.raises(cli_bundle.BundleError, match=r"on_something_new .*no route"):
        cli_bundle.deployment(main_py)


def test_a_new_http_entry_point_is_deployed_private(tmp_path: Path) -> None:
    main_py = tmp_path / "main.py"
    main_py.write_text(
        (ROOT / "functions" / "main.py").read_text()
        + (
            "\n\n@functions_framework.http\n"
            "def export_audit(request):  # type: ignore[no-untyped-def]\n"
            "    return ''\n"
        )
    )
    plan = cli_bundle.deployment(main_py)
    fn = plan.functions["export_audit"]
    assert (fn.kind, fn.access, fn.schedule) == ("http", "scheduler", None)
    assert any("export_audit" in w for w in plan.warnings)


@pytest.mark.parametrize(
    ("name", "access", "schedule"),
    [
        ("chat", "public", None),
        ("slack_events", "public", None),
        ("dashboard", "iap", None),
        ("proxy", "iap", None),
        ("links", "iap", None),
        ("reconcile", "scheduler", "*/10 * * * *"),
        ("janitor", "scheduler", "17 * * * *"),
        ("idle_sweep", "scheduler", "*/5 * * * *"),
        ("cost_rollup", "scheduler", "41 * * * *"),
        ("something_else", "scheduler", None),
    ],
)
def test_http_functions_are_classified_by_name(
    name: str, access: str, schedule: str | None
) -> None:
    assert cli_bundle.http_access(name) == access
    assert (cli_bundle.http_schedule(name) if access == "scheduler" else None) == schedule


def test_check_only_checks(tmp_path: Path) -> None:
    result = CliRunner().invoke(main, ["bundle", "--check", "--out", str(tmp_path / "x.zip")])
    assert result.exit_code == 0, result.output
    assert not (tmp_path / "x.zip").exists()
