"""`stasis bundle`: the Cloud Functions source zip, and the Terraform variables that the code
decides (which functions exist, which event each one takes, which topics there are).

Terraform never lists functions or topics by hand. The deployment is derived from the same
tables the local stack uses: ``functions/main.py`` (every entry point, and whether it takes
CloudEvents or HTTP), ``functions/routes.py`` (the event each CloudEvent function consumes),
``events.CATALOG`` (one topic per event type), ``dead_letter_topic`` and
``MAX_DELIVERY_ATTEMPTS``. A new entry point is deployed by the next
``stasis bundle && terraform apply`` with no edit under terraform/.

The zip holds functions/, events/, schemas/, a ``requirements.txt`` and a root ``main.py``
that re-exports the entry points of ``functions.main`` (Cloud Functions loads ``main.py``
from the root of the source and looks the entry point up by name). It is deterministic: the
same tree gives the same bytes and the same sha256, so Terraform redeploys only when the
code changed.

HTTP functions are classified by name, because the code carries no other hint of who calls
them: ``slack``/``chat`` is public (Slack signs its requests; the function verifies them),
``dashboard``/``proxy``/``links`` sit behind IAP, anything else is private and invoked only by Cloud
Scheduler (with a schedule when its name says which job it is). Unknown names get the
safest class: private, no schedule. ``--check`` fails when main.py and routes.py disagree.

Registered by one import at the end of ``stack/cli.py``.
"""

from __future__ import annotations

import ast
import hashlib
import importlib.metadata
import importlib.util
import io
import json
import os
import re
import sys
import zipfile
from collections.abc import Iterable, Iterator
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import click

from stack.cli import main

ROOT = Path(__file__).resolve().parent.parent
BUNDLED = ("functions", "events", "schemas")
DEFAULT_ZIP = "build/stasis-functions.zip"
TFVARS_NAME = "stasis.auto.tfvars.json"
ENVIRONMENTS = ROOT / "terraform" / "environments"
DEFAULT_CONFIG = ROOT / "examples" / "stasis.yaml"
#: Fixed timestamp of every zip member (the zip format cannot say 1970).
_ZIP_TIME = (1980, 1, 1, 0, 0, 0)
_SKIP_DIRS = {"__pycache__", ".mypy_cache", ".pytest_cache", ".ruff_cache"}
_SKIP_SUFFIXES = {".pyc", ".pyo"}

#: (pattern on the function name, access). First match wins; no match: "scheduler".
HTTP_ACCESS_RULES: tuple[tuple[str, str], ...] = (
    (r"slack|chat", "public"),
    (r"dashboard|proxy|console|link", "iap"),
)
#: (pattern on the function name, Cloud Scheduler cron) for the private HTTP functions.
SCHEDULE_RULES: tuple[tuple[str, str], ...] = (
    (r"^reconcil", "*/10 * * * *"),
    (r"janitor|retention|expir", "17 * * * *"),
    (r"idle|sweep", "*/5 * * * *"),
    (r"cost|rollup", "41 * * * *"),
)
ACCESS_KINDS = ("event", "public", "iap", "scheduler")


class BundleError(Exception):
    """The code's tables disagree; nothing was written."""


@dataclass(frozen=True)
class Function:
    """One deployed function, as Terraform receives it."""

    name: str  # the Python entry point
    kind: str  # "cloudevent" or "http"
    access: str  # one of ACCESS_KINDS
    deploy_name: str  # the Cloud Functions / Cloud Run name
    account_id: str  # its own service account
    event: str | None = None
    topic: str | None = None
    dead_letter_topic: str | None = None
    subscription: str | None = None
    dead_letter_subscription: str | None = None
    ordered: bool = False
    schedule: str | None = None


@dataclass(frozen=True)
class Deployment:
    functions: dict[str, Function]
    topics: dict[str, str]  # event name -> topic
    max_delivery_attempts: int
    warnings: list[str] = field(default_factory=list)
    kubernetes: dict[str, Any] = field(default_factory=dict)

    def tfvars(self, source_archive: str, source_sha256: str) -> dict[str, Any]:
        def strip(fn: Function) -> dict[str, Any]:
            return {k: v for k, v in asdict(fn).items() if v is not None and k != "name"}

        return {
            "source_archive": source_archive,
            "source_sha256": source_sha256,
            "event_topics": dict(sorted(self.topics.items())),
            "max_delivery_attempts": self.max_delivery_attempts,
            "event_functions": {
                n: strip(f) for n, f in sorted(self.functions.items()) if f.kind == "cloudevent"
            },
            "http_functions": {
                n: strip(f) for n, f in sorted(self.functions.items()) if f.kind == "http"
            },
            "kubernetes": self.kubernetes,
        }


# --- what the code says ------------------------------------------------------------------------
def entry_points(main_py: Path = ROOT / "functions" / "main.py") -> dict[str, str]:
    """Every decorated function of ``functions/main.py`` -> "cloudevent" or "http".

    Read from the source (not imported) so that a bundle can be built where the runtime
    dependencies of the functions are not installed.
    """
    found: dict[str, str] = {}
    for node in ast.parse(main_py.read_text()).body:
        if not isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
            continue
        for deco in node.decorator_list:
            target = deco.func if isinstance(deco, ast.Call) else deco
            name = ast.unparse(target)
            if "functions_framework" not in name and not name.startswith(("cloud_event", "http")):
                continue
            found[node.name] = "cloudevent" if "cloud_event" in name else "http"
    return found


def deployment(
    main_py: Path = ROOT / "functions" / "main.py", config: Path = DEFAULT_CONFIG
) -> Deployment:
    """The functions, topics, delivery settings and cluster objects Terraform deploys,
    from the code (and the teams and storage classes of the admin ``config``)."""
    from events import CATALOG
    from functions.adapters.pubsub_bus import ORDERED_BY_TEAM, dead_letter_topic
    from functions.delivery import MAX_DELIVERY_ATTEMPTS
    from functions.routes import HTTP_FUNCTIONS, ROUTES
    from stack.topology import dead_letter_subscription, subscription_for

    entries = entry_points(main_py)
    problems: list[str] = []
    warnings: list[str] = []
    for name, route in sorted(ROUTES.items()):
        if name not in entries:
            problems.append(
                f"routes.py routes {route.event} to {name}, which functions/main.py does not define"
            )
        elif entries[name] != "cloudevent":
            problems.append(f"{name} is routed an event but is an HTTP function in main.py")
        if route.event not in CATALOG:
            problems.append(f"{name} takes {route.event}, which is not in events.CATALOG")
    for name, kind in sorted(entries.items()):
        if kind == "cloudevent" and name not in ROUTES:
            problems.append(f"{name} takes CloudEvents in main.py but has no route in routes.py")
        if kind == "http" and name not in HTTP_FUNCTIONS:
            warnings.append(
                f"{name} is an HTTP entry point missing from routes.HTTP_FUNCTIONS "
                "(deployed anyway)"
            )
    for name in HTTP_FUNCTIONS:
        if name not in entries:
            problems.append(f"routes.HTTP_FUNCTIONS names {name}, which main.py does not define")
    if problems:
        raise BundleError("; ".join(problems))

    functions: dict[str, Function] = {}
    for name, kind in entries.items():
        common = {
            "name": name,
            "kind": kind,
            "deploy_name": deploy_name(name),
            "account_id": account_id(name),
        }
        if kind == "cloudevent":
            route = ROUTES[name]
            functions[name] = Function(
                **common,
                access="event",
                event=route.event,
                topic=route.topic,
                dead_letter_topic=dead_letter_topic(name),
                subscription=subscription_for(name),
                dead_letter_subscription=dead_letter_subscription(name),
                ordered=route.event in ORDERED_BY_TEAM,
            )
        else:
            access = http_access(name)
            schedule = http_schedule(name) if access == "scheduler" else None
            if access == "scheduler" and schedule is None:
                warnings.append(
                    f"{name}: private HTTP function without a schedule (set one "
                    "with the Terraform variable schedule_overrides)"
                )
            functions[name] = Function(**common, access=access, schedule=schedule)
    topics = {name: spec.topic for name, spec in CATALOG.items()}
    return Deployment(
        functions,
        topics,
        MAX_DELIVERY_ATTEMPTS,
        warnings,
        kubernetes_objects(*_teams_and_classes(config)),
    )


# --- the cluster's objects -------------------------------------------------------------------
#: Placeholders Terraform fills in (modules/kubernetes): values only it knows.
PLACEHOLDERS = (
    "@@PROJECT@@",
    "@@BUCKET@@",
    "@@AGENT_IMAGE@@",
    "@@MONITOR_GSA@@",
    "@@DISK_KMS_KEY@@",
)
SUBJECTS = "@@RUNTIME_SUBJECTS@@"


def kubernetes_objects(teams: Iterable[str], storage_classes: dict[str, str]) -> dict[str, Any]:
    """What Terraform applies in the cluster, built by ``functions.domain.manifests`` (the
    same builders the Kubernetes runtime applies), as JSON by tier and key, and the names
    the IAM bindings need.

    Every RBAC binding's subjects become the ``@@RUNTIME_SUBJECTS@@`` list: Terraform puts
    each runtime function's own identity there. The per-team binding is named
    ``<role>-functions``, beside the one the runtime creates for its own identity.
    """
    from functions.domain import manifests as m

    subject = {"kind": "User", "name": SUBJECTS, "apiGroup": m.RBAC_API}
    objects: list[dict[str, Any]] = [*m.control_plane_rbac(subject)]
    objects += m.monitor_manifests(
        project="@@PROJECT@@", image="@@AGENT_IMAGE@@", gcp_service_account="@@MONITOR_GSA@@"
    )
    team_info: dict[str, dict[str, str]] = {}
    for team in sorted(set(teams)):
        binding = m.team_role_binding(team, subject)
        binding["metadata"]["name"] += "-functions"
        objects += [
            m.team_namespace(team),
            m.team_service_account(team),
            binding,
            m.snapshot_storage_config(team, "@@BUCKET@@", team_prefix=f"snapshots/{team}"),
            m.snapshot_policy(team),
        ]
        team_info[team] = {
            "namespace": m.team_namespace_name(team),
            "snapshot_prefix": f"snapshots/{team}/",
        }
    for name, disk_type in sorted(storage_classes.items()):
        objects.append(m.encrypted_storage_class(name, "@@DISK_KMS_KEY@@", disk_type=disk_type))

    tiers: dict[str, dict[str, str]] = {"namespaces": {}, "cluster": {}, "namespaced": {}}
    for obj in objects:
        if any(s.get("name") == SUBJECTS for s in obj.get("subjects", ())):
            obj["subjects"] = [SUBJECTS]
        meta = obj["metadata"]
        tier = (
            "namespaces"
            if obj["kind"] == "Namespace"
            else "namespaced"
            if meta.get("namespace")
            else "cluster"
        )
        key = "/".join((obj["kind"], meta.get("namespace", "_"), meta["name"])).lower()
        if key in tiers[tier]:
            raise BundleError(f"two cluster objects named {key}")
        tiers[tier][key] = json.dumps(obj, sort_keys=True, separators=(",", ":"))
    return {
        "manifests": tiers,
        "teams": team_info,
        "monitor": {"namespace": m.SYSTEM_NAMESPACE, "service_account": m.MONITOR},
        "workspace_service_account": m.WORKSPACE_SA,
    }


def _teams_and_classes(config: Path) -> tuple[list[str], dict[str, str]]:
    """The teams of the admin configuration, and every storage class its profiles (and the
    runtime's default) name -> its disk type (``premium`` in the name: SSD)."""
    import yaml

    from functions.domain.manifests import ClusterSettings

    data = yaml.safe_load(config.read_text()) or {}
    teams = [str(t["id"]) for t in data.get("teams") or []]
    names = {ClusterSettings().storage_class}
    names |= {
        str((p.get("disk") or {}).get("storage_class"))
        for p in data.get("profiles") or []
        if (p.get("disk") or {}).get("storage_class")
    }
    return teams, {n: "pd-ssd" if "premium" in n else "pd-balanced" for n in names}


def http_access(name: str) -> str:
    for pattern, access in HTTP_ACCESS_RULES:
        if re.search(pattern, name):
            return access
    return "scheduler"


def http_schedule(name: str) -> str | None:
    for pattern, cron in SCHEDULE_RULES:
        if re.search(pattern, name):
            return cron
    return None


def deploy_name(function: str) -> str:
    """``on_workspace_ready`` -> ``stasis-on-workspace-ready`` (Cloud Run: [a-z0-9-], <= 49)."""
    return _slug("stasis-" + function, 49)


def account_id(function: str) -> str:
    """A service account id (6-30 of [a-z0-9-], starting with a letter), unique per function:
    too long a name is cut and given a short hash so that two never collide."""
    return _slug("sx-" + function, 30)


def _slug(text: str, limit: int) -> str:
    slug = re.sub(r"[^a-z0-9]+", "-", text.lower()).strip("-")
    if len(slug) <= limit:
        return slug
    digest = hashlib.sha256(text.encode()).hexdigest()[:6]
    return slug[: limit - 7].rstrip("-") + "-" + digest


# --- the source bundle -------------------------------------------------------------------------
def bundle_files(root: Path = ROOT) -> Iterator[tuple[str, Path]]:
    """(name in the zip, file) for every file of the bundled packages, sorted."""
    for package in BUNDLED:
        base = root / package
        for path in sorted(base.rglob("*")):
            rel = path.relative_to(root)
            if path.is_dir() or _SKIP_DIRS & set(rel.parts) or path.suffix in _SKIP_SUFFIXES:
                continue
            yield rel.as_posix(), path


def shim(entries: Iterable[str]) -> str:
    """The root ``main.py`` Cloud Functions loads: re-exports the entry points by name."""
    names = sorted(entries)
    lines = [
        '"""Generated by `stasis bundle`: Cloud Functions loads main.py at the root of the',
        'source; the entry points live in functions/main.py."""',
        "",
        "from functions.main import (  # noqa: F401",
    ]
    lines += [f"    {name}," for name in names]
    lines += [")", "", f"__all__ = {names!r}", ""]
    return "\n".join(lines)


def requirements(root: Path = ROOT) -> list[str]:
    """``name==version`` of every installed distribution the bundled code imports (and
    functions-framework): the versions the tests ran against."""
    required: set[str] = set()
    optional: set[str] = set()
    for _, path in bundle_files(root):
        if path.suffix == ".py":
            needed, maybe = _imports(path)
            required |= needed
            optional |= maybe
    first_party = set(BUNDLED) | {"runtime", "stack", "tests", "main"}
    owners = _module_owners()
    dists: dict[str, str] = {}
    for module in sorted(required | optional):
        top = module.split(".")[0]
        if top in sys.stdlib_module_names or top in first_party:
            continue
        try:
            spec = importlib.util.find_spec(module)
        except (ImportError, ValueError):
            spec = None
        if spec is None:
            if module in required:
                raise BundleError(f"the bundled code imports {module}, which is not installed")
            continue  # `from x import name` where name is not a module
        if not spec.origin or spec.origin in ("built-in", "frozen", "namespace"):
            continue  # a namespace package (google, google.cloud): its modules say who
        dist = owners.get(os.path.normpath(spec.origin)) or owners.get(
            str(Path(spec.origin).resolve())
        )
        if dist is None:
            raise BundleError(
                f"the bundled code imports {module} ({spec.origin}), which no "
                "installed distribution provides"
            )
        dists[dist] = importlib.metadata.version(dist)
    dists.setdefault("functions-framework", importlib.metadata.version("functions-framework"))
    return [f"{name}=={version}" for name, version in sorted(dists.items(), key=_lower)]


def _lower(item: tuple[str, str]) -> str:
    return item[0].lower()


def _imports(path: Path) -> tuple[set[str], set[str]]:
    """(modules the file surely imports, names that may be modules: ``from a import b``)."""
    needed: set[str] = set()
    maybe: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
        if isinstance(node, ast.Import):
            needed |= {alias.name for alias in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            needed.add(node.module)
            maybe |= {f"{node.module}.{alias.name}" for alias in node.names}
    return needed, maybe


def _module_owners() -> dict[str, str]:
    """Installed file (absolute, resolved) -> the distribution that installed it."""
    owners: dict[str, str] = {}
    for dist in importlib.metadata.distributions():
        name = dist.metadata["Name"]
        for file in dist.files or ():
            if file.suffix == ".py":
                owners[os.path.normpath(str(dist.locate_file(file)))] = name
    return owners


def build_zip(out: Path, entries: Iterable[str], reqs: list[str], root: Path = ROOT) -> str:
    """Write the bundle to ``out``; returns its sha256."""
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w", compression=zipfile.ZIP_DEFLATED) as zf:
        members = [
            ("main.py", shim(entries).encode()),
            ("requirements.txt", ("\n".join(reqs) + "\n").encode()),
        ]
        members += [(name, path.read_bytes()) for name, path in bundle_files(root)]
        for name, data in sorted(members):
            info = zipfile.ZipInfo(name, date_time=_ZIP_TIME)
            info.external_attr = 0o644 << 16
            info.compress_type = zipfile.ZIP_DEFLATED
            zf.writestr(info, data)
    data = buffer.getvalue()
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_bytes(data)
    return hashlib.sha256(data).hexdigest()


def write_tfvars(path: Path, plan: Deployment, archive: Path, sha256: str) -> None:
    """The generated variables, with the archive path relative to the file's directory
    (Terraform runs in that directory)."""
    rel = os.path.relpath(archive.resolve(), path.resolve().parent)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(plan.tfvars(rel, sha256), indent=2) + "\n")


# --- the command -------------------------------------------------------------------------------
@click.command("bundle")
@click.option(
    "--out",
    default=DEFAULT_ZIP,
    show_default=True,
    type=click.Path(dir_okay=False),
    help="Where to write the source zip.",
)
@click.option(
    "--env",
    "envs",
    multiple=True,
    help="Write terraform/environments/ENV/stasis.auto.tfvars.json (repeatable; "
    "default: every environment there).",
)
@click.option(
    "--tfvars",
    "extra",
    multiple=True,
    type=click.Path(dir_okay=False),
    help="Also write the generated variables to this file.",
)
@click.option(
    "--config",
    default=str(DEFAULT_CONFIG),
    show_default=True,
    type=click.Path(exists=True, dir_okay=False),
    help="Admin configuration whose teams get namespaces and Pod Snapshot storage "
    "configurations, and whose profiles' storage classes are created.",
)
@click.option("--check", is_flag=True, help="Only check main.py, routes.py and events agree.")
def bundle(
    out: str, envs: tuple[str, ...], extra: tuple[str, ...], config: str, check: bool
) -> None:
    """Build the Cloud Functions source zip and the Terraform variables derived from the code
    (functions, triggers, topics, dead-letter topics)."""
    try:
        plan = deployment(config=Path(config))
    except BundleError as exc:
        raise click.ClickException(str(exc)) from None
    for warning in plan.warnings:
        click.echo(f"warning: {warning}", err=True)
    kinds = ", ".join(
        f"{sum(f.access == k for f in plan.functions.values())} {k}" for k in ACCESS_KINDS
    )
    teams = ", ".join(plan.kubernetes["teams"]) or "none"
    click.echo(
        f"{len(plan.functions)} functions ({kinds}), {len(plan.topics)} topics; "
        f"teams from {config}: {teams}"
    )
    if check:
        return
    try:
        reqs = requirements()
    except BundleError as exc:
        raise click.ClickException(str(exc)) from None
    archive = Path(out)
    sha = build_zip(archive, plan.functions, reqs)
    click.echo(
        f"{archive} ({archive.stat().st_size / 1024:.0f} KiB, sha256 {sha[:12]}, "
        f"{len(reqs)} requirements)"
    )
    targets = [ENVIRONMENTS / env / TFVARS_NAME for env in envs] or [
        d / TFVARS_NAME for d in sorted(ENVIRONMENTS.iterdir()) if d.is_dir()
    ]
    for target in [*targets, *map(Path, extra)]:
        if not target.parent.is_dir() and target.parent.parent == ENVIRONMENTS:
            raise click.ClickException(f"no environment {target.parent.name} under {ENVIRONMENTS}")
        write_tfvars(target, plan, archive, sha)
        click.echo(f"wrote {target}")


main.add_command(bundle)
