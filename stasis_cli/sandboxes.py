"""`stasis sandbox run|list|show|apply|cancel|resume`: background tasks that return patches.

`run` publishes sandbox.requested (as chat or an agent would) and, with `--wait`, follows
the sandbox through the queue to its end. `show` prints the patch on stdout (the summary
goes to stderr, so `stasis sandbox show ID > fix.patch` works), `apply` applies it to a
checkout with `git apply` after checking it applies: patches are never applied on their own.

A sandbox idle past its ``idle_seconds`` is SUSPENDED: `list` shows for how long, `show`
prints its checkpoint patch (the work so far), and `resume` publishes
sandbox.resume_requested; it runs again when one of the team's slots is free. `--wait`
stops at a suspension too (exit status 5): nothing happens to it until someone resumes it.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import time
import uuid
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import click

from stasis_cli import options

TERMINAL = {"SUCCEEDED", "FAILED", "TIMED_OUT", "KILLED"}
SUSPENDED_EXIT = options.EXIT_SUSPENDED


def new_sandbox_id(now: datetime | None = None) -> str:
    """``sbx-YYYYmmdd-HHMMSS-xxxxxx``: sortable by time, unique, a valid label."""
    now = now or datetime.now(UTC)
    return f"sbx-{now:%Y%m%d-%H%M%S}-{uuid.uuid4().hex[:6]}"


def _db() -> Any:
    from google.cloud import firestore

    return firestore.Client(project=os.environ.get("STASIS_PROJECT", "stasis-local"))


def _doc(sandbox_id: str) -> dict[str, Any] | None:
    snap = _db().collection("sandboxes").document(sandbox_id).get()
    return snap.to_dict() if snap.exists else None


def _read_uri(uri: str) -> bytes:
    from functions.adapters.snapshots import storage_client

    if not uri.startswith("gs://"):
        raise click.ClickException(f"not a Cloud Storage URI: {uri}")
    bucket, _, name = uri[len("gs://"):].partition("/")
    client = storage_client(os.environ.get("STASIS_PROJECT", "stasis-local"))
    try:
        data: bytes = client.bucket(bucket).blob(name).download_as_bytes()
    except Exception as exc:
        raise click.ClickException(f"cannot read {uri}: {exc}") from None
    return data


#: The fields a person typed, which may carry credentials: shown redacted.
_TYPED = frozenset({"repository", "command", "message"})


def _redact(value: Any) -> str:
    """``functions.domain.redaction.redact``, imported when first shown: ``stasis --help``
    and the quick verbs load nothing of the control plane (tests/unit/test_cli.py)."""
    from functions.domain.redaction import redact as shown

    return shown(value)


def _jsonable(doc: dict[str, Any]) -> dict[str, Any]:
    return {k: (_redact(v) if k in _TYPED and v is not None
                else v.isoformat() if hasattr(v, "isoformat") else v) for k, v in doc.items()}


@click.group()
def sandbox() -> None:
    """Run a task in an isolated sandbox; get a patch back for review."""


def task_options(fn: Any) -> Any:
    """The task's options, the same for `stasis sandbox run` and `stasis link sandbox`:
    repository, command, base ref, allowed network and the limits (see :func:`limits_of`)."""
    options = [
        click.option("--repo", "repository", required=True,
                     help="A local path (on the runtime's host) or a git URL it can reach."),
        click.option("--command", "command", required=True,
                     help="Run with /bin/sh -c in the copy."),
        click.option("--base", "base_ref", default="HEAD", show_default=True, help="Base ref."),
        click.option("--allow-network", "allowed", multiple=True,
                     help="A destination the task may reach (repeatable); none by default."),
        click.option("--cpu-seconds", type=int, default=None,
                     help="Default: the team's policy."),
        click.option("--memory", default=None, help="e.g. 2Gi. Default: the team's policy."),
        click.option("--timeout", "wall_clock", type=int, default=None,
                     help="Wall clock seconds. Default: the team's policy."),
        click.option("--processes", type=int, default=None, help="Default: the team's policy."),
        click.option("--idle-seconds", "idle", type=int, default=None,
                     help="Suspend the task after this long without progress (0: never, if "
                          "the policy permits). Default: the team's policy."),
        click.option("--disk", default=None,
                     help="Disk quota of the working copy, home and tmp together, e.g. 4Gi. "
                          "Default: the team's policy."),
    ]
    for option in reversed(options):
        fn = option(fn)
    return fn


def limits_of(cpu_seconds: int | None, memory: str | None, wall_clock: int | None,
              processes: int | None, idle: int | None, disk: str | None = None,
              ) -> dict[str, Any]:
    """The limits a request asks for; the ones not given come from the team's policy."""
    return {k: v for k, v in (
        ("cpu_seconds", cpu_seconds), ("memory", memory), ("wall_clock_seconds", wall_clock),
        ("processes", processes), ("idle_seconds", idle), ("disk", disk)) if v is not None}


@sandbox.command("run")
@task_options
@click.option("--team", default=None, help="Team (default: your first team).")
@click.option("--id", "sandbox_id", default=None, help="Sandbox id (default: a new one).")
@options.as_user
@options.wait
@click.option("--wait-timeout", type=float, default=3600.0, show_default=True)
@options.json_output
def sandbox_run(repository: str, command: str, base_ref: str, allowed: tuple[str, ...],
                cpu_seconds: int | None, memory: str | None, wall_clock: int | None,
                processes: int | None, idle: int | None, disk: str | None, team: str | None,
                sandbox_id: str | None, wait: bool, wait_timeout: float,
                as_json: bool) -> None:
    """Run COMMAND on a working copy of REPO at BASE; the result is a patch.

    With --wait the exit status is 0 when it succeeded, 5 when it was suspended (idle;
    `stasis sandbox resume ID`), 1 otherwise."""
    from events import SandboxRequested

    settings = options.stack_settings()
    user = options.acting_user()
    team = options.team_of(user, team)
    if "://" not in repository and not repository.startswith("git@"):
        path = Path(repository).expanduser().resolve()
        if not (path / ".git").exists():
            raise click.UsageError(f"{path} is not a git checkout")
        repository = str(path)
    limits = limits_of(cpu_seconds, memory, wall_clock, processes, idle, disk)
    payload = SandboxRequested(
        sandbox_id=sandbox_id or new_sandbox_id(), team=team, requester=user,
        repository=repository, command=command, base_ref=base_ref, limits=limits,
        allowed_network=list(dict.fromkeys(allowed)))
    event = options.publish(settings, payload)
    if not wait:
        out = {"sandbox_id": payload.sandbox_id, "requestid": event.requestid}
        click.echo(json.dumps(out) if as_json else
                   f"requested sandbox {payload.sandbox_id} (request {event.requestid}); "
                   f"follow with `stasis sandbox show {payload.sandbox_id}`")
        return
    doc = follow(payload.sandbox_id, timeout=wait_timeout,
                 progress=None if as_json else click.echo)
    if as_json:
        options.echo_json(_jsonable(doc))
    sys.exit(_exit_status(doc))


def _exit_status(doc: dict[str, Any]) -> int:
    if doc.get("state") == "SUCCEEDED":
        return 0
    return SUSPENDED_EXIT if doc.get("state") == "SUSPENDED" else 1


def _held(doc: dict[str, Any]) -> bool:
    """Suspended with no resume on its way: nothing happens until someone resumes it."""
    return doc.get("state") == "SUSPENDED" and not doc.get("queue_position")


def follow(sandbox_id: str, *, timeout: float, progress: Any = None,
           after_version: int = 0) -> dict[str, Any]:
    """Wait for the sandbox to end or be suspended (a version above ``after_version``);
    report each state and queue position on the way."""
    say = progress or (lambda _m: None)
    deadline = time.monotonic() + timeout
    seen: tuple[Any, ...] | None = None
    started = time.monotonic()
    while time.monotonic() < deadline:
        doc = _doc(sandbox_id)
        if doc is None or int(doc.get("version") or 0) <= after_version:
            time.sleep(0.2)
            continue
        key = (doc.get("state"), doc.get("queue_position"), doc.get("suspensions"))
        if key != seen:
            say(f"{sandbox_id}: {doc.get('state')} ({time.monotonic() - started:.1f}s) — "
                f"{_redact(doc.get('message'))}")
            seen = key
        if doc.get("state") in TERMINAL or _held(doc):
            return doc
        time.sleep(0.2)
    raise click.ClickException(f"timed out after {timeout:g}s waiting for {sandbox_id}")


@sandbox.command("list")
@click.option("--team", default=None)
@click.option("--all", "all_", is_flag=True, help="Include ended sandboxes.")
@options.as_user
@options.json_output
def sandbox_list(team: str | None, all_: bool, as_json: bool) -> None:
    """Sandboxes, newest first: state, queue position, requester, files changed."""
    from google.cloud import firestore

    options.stack_settings()
    query: Any = _db().collection("sandboxes")
    if team:
        query = query.where(filter=firestore.FieldFilter("team", "==", team))
    rows = [d.to_dict() for d in query.limit(500).stream()]
    rows = [r for r in rows if all_ or r.get("state") not in TERMINAL
            or _recent(r.get("finished_at"))]
    rows.sort(key=lambda r: r.get("requested_at") or datetime.min.replace(tzinfo=UTC),
              reverse=True)
    if as_json:
        options.echo_json([_jsonable(r) for r in rows])
        return
    if not rows:
        click.echo("no sandboxes")
    for r in rows:
        where = f"#{r['queue_position']}" if r.get("queue_position") else ""
        reason = str(r.get("reason"))
        if r.get("state") == "SUSPENDED":
            reason += f", idle for {_ago(r.get('suspended_at'))}"
        click.echo(f"{r['id']:<32} {r['team']:<8} {r['state']:<10} {where:<4} "
                   f"{r['requester']:<8} {len(r.get('files_changed') or []):>3} files  "
                   f"{reason}")


def _ago(when: Any) -> str:
    if not isinstance(when, datetime):
        return "?"
    seconds = max(0, int((datetime.now(UTC) - when).total_seconds()))
    if seconds < 120:
        return f"{seconds}s"
    return f"{seconds // 60}m" if seconds < 7200 else f"{seconds // 3600}h"


def _recent(when: Any, hours: float = 24.0) -> bool:
    return isinstance(when, datetime) and (
        datetime.now(UTC) - when).total_seconds() < hours * 3600


@sandbox.command("show")
@click.argument("sandbox_id")
@click.option("--log", "show_log", is_flag=True, help="Print the task's log, not the patch.")
@options.as_user
@options.json_output
def sandbox_show(sandbox_id: str, show_log: bool, as_json: bool) -> None:
    """Print SANDBOX_ID's patch (summary on stderr); --log prints its log."""
    options.stack_settings()
    doc = _doc(sandbox_id)
    if doc is None:
        raise click.ClickException(f"no sandbox {sandbox_id}")
    if as_json:
        options.echo_json(_jsonable(doc))
        return
    for key in ("state", "reason", "message", "requester", "repository", "base_ref",
                "base_sha", "command", "exit_status", "termination", "network",
                "duration_ms", "cpu_seconds", "peak_memory_bytes", "patch_uri", "log_uri",
                "suspensions", "checkpoint_uri"):
        if doc.get(key) not in (None, "", 0):
            click.echo(f"{key:<17} {_redact(doc[key])}", err=True)
    if doc.get("state") == "SUSPENDED":
        click.echo(f"{'suspended for':<17} {_ago(doc.get('suspended_at'))}", err=True)
    uri = doc.get("log_uri") if show_log else doc.get("patch_uri")
    if doc.get("state") == "SUSPENDED" and not show_log and doc.get("checkpoint_uri"):
        click.echo("(suspended: the checkpoint patch, its work so far)", err=True)
        sys.stdout.buffer.write(_read_uri(doc["checkpoint_uri"]))
        sys.stdout.flush()
        return
    if doc.get("state") not in TERMINAL:
        click.echo("(not finished yet)", err=True)
        return
    if not uri:
        click.echo(f"(no {'log' if show_log else 'patch'})", err=True)
        return
    data = _read_uri(uri)
    if show_log:  # the log repeats the command as typed: shown redacted, as everywhere
        data = _redact(data.decode("utf-8", errors="replace")).encode()
    sys.stdout.buffer.write(data)
    sys.stdout.flush()


@sandbox.command("apply")
@click.argument("sandbox_id")
@click.option("--to", "checkout", required=True, type=click.Path(file_okay=False, exists=True),
              help="The git checkout to apply the patch to (its working tree).")
@click.option("--check", is_flag=True, help="Only check that it applies.")
@options.as_user
@options.json_output
def sandbox_apply(sandbox_id: str, checkout: str, check: bool, as_json: bool) -> None:
    """Apply SANDBOX_ID's patch to CHECKOUT's working tree (git apply); commit it yourself."""
    options.stack_settings()
    doc = _doc(sandbox_id)
    if doc is None:
        raise click.ClickException(f"no sandbox {sandbox_id}")
    if doc.get("state") not in TERMINAL:
        raise click.ClickException(f"sandbox {sandbox_id} is {doc.get('state')}: no patch yet")
    if not doc.get("patch_uri"):
        raise click.ClickException(f"sandbox {sandbox_id} has no patch ({doc.get('message')})")
    patch = _read_uri(doc["patch_uri"])
    files = doc.get("files_changed") or []
    done = {"sandbox_id": sandbox_id, "checkout": checkout, "files": files}
    if not patch:
        _said(as_json, {**done, "applied": False, "files": []},
              f"sandbox {sandbox_id} changed no files: nothing to apply")
        return
    head = _git(checkout, "rev-parse", "HEAD", check=False).stdout.strip()
    if doc.get("base_sha") and head and head != doc["base_sha"]:
        click.echo(f"note: {checkout} is at {head[:12]}, the patch was made against "
                   f"{doc['base_sha'][:12]}", err=True)
    with tempfile.NamedTemporaryFile(suffix=".patch", delete=False) as f:
        f.write(patch)
    try:
        verdict = _git(checkout, "apply", "--check", "--binary", f.name, check=False)
        if verdict.returncode != 0:
            raise click.ClickException(f"the patch does not apply to {checkout}:\n"
                                       f"{verdict.stderr.strip()}")
        if check:
            _said(as_json, {**done, "applied": False, "applies": True},
                  f"the patch of {sandbox_id} applies to {checkout}")
            return
        _git(checkout, "apply", "--binary", f.name)
    finally:
        os.unlink(f.name)
    _said(as_json, {**done, "applied": True},
          f"applied {sandbox_id} to {checkout}: {len(files)} files "
          f"({', '.join(files[:5])}{', ...' if len(files) > 5 else ''}); review with "
          "`git diff`, then commit")


def _said(as_json: bool, data: dict[str, Any], text: str) -> None:
    """``data`` as JSON with --json, else ``text``."""
    if as_json:
        options.echo_json(data)
    else:
        click.echo(text)


@sandbox.command("cancel")
@click.argument("sandbox_id")
@options.as_user
@options.json_output
def sandbox_cancel(sandbox_id: str, as_json: bool) -> None:
    """Stop a running sandbox (local runtime); it reports KILLED (cancelled) with its patch."""
    from functions.adapters.sandbox_runtime import LocalSandboxRuntime
    from functions.ports import RuntimeRefused, RuntimeUnavailable

    settings = options.stack_settings()
    try:
        answer = LocalSandboxRuntime(settings.node_agent_url,
                                     token=settings.node_agent_token())._call(
            "DELETE", f"/sandboxes/{sandbox_id}")
    except (RuntimeRefused, RuntimeUnavailable) as exc:
        raise click.ClickException(str(exc)) from None
    _said(as_json, answer, f"{sandbox_id}: " + ("cancelling" if answer.get("cancelled")
                                                else f"not running ({answer.get('state')})"))


@sandbox.command("resume")
@click.argument("sandbox_id")
@options.as_user
@options.wait
@click.option("--wait-timeout", type=float, default=3600.0, show_default=True)
@options.json_output
def sandbox_resume(sandbox_id: str, wait: bool, wait_timeout: float, as_json: bool) -> None:
    """Resume a suspended SANDBOX_ID; it waits in the team's queue when no slot is free.
    --wait follows it to its end (or its next suspension)."""
    from events import SandboxResumeRequested

    settings = options.stack_settings()
    doc = _doc(sandbox_id)
    if doc is None:
        raise click.ClickException(f"no sandbox {sandbox_id}")
    if doc.get("state") != "SUSPENDED":
        raise click.ClickException(f"sandbox {sandbox_id} is {doc.get('state')}, not "
                                   "suspended: nothing to resume")
    event = options.publish(settings, SandboxResumeRequested(
        sandbox_id=sandbox_id, requester=options.acting_user()))
    if not wait:
        out = {"sandbox_id": sandbox_id, "requestid": event.requestid}
        click.echo(json.dumps(out) if as_json else
                   f"asked to resume {sandbox_id} (request {event.requestid}); follow with "
                   f"`stasis sandbox show {sandbox_id}`")
        return
    _refused(event.requestid, sandbox_id, int(doc.get("version") or 0), timeout=wait_timeout)
    doc = follow(sandbox_id, timeout=wait_timeout, progress=None if as_json else click.echo,
                 after_version=int(doc.get("version") or 0))
    if as_json:
        options.echo_json(_jsonable(doc))
    sys.exit(_exit_status(doc))


def _refused(requestid: str, sandbox_id: str, version: int, *, timeout: float) -> None:
    """Wait until the request was decided: a refusal (not a member, say) changes no
    record, only the audit says it; raise with its message then."""
    from google.cloud import firestore

    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        doc = _doc(sandbox_id) or {}
        if int(doc.get("version") or 0) > version:
            return
        query = _db().collection("audit").where(
            filter=firestore.FieldFilter("requestid", "==", requestid))
        for entry in (e.to_dict() for e in query.limit(1).stream()):
            if str(entry.get("outcome", "")).startswith("refused"):
                raise click.ClickException(f"{sandbox_id}: {entry.get('message')}")
            return
        time.sleep(0.2)
    raise click.ClickException(f"timed out after {timeout:g}s waiting for {sandbox_id}")


def _git(checkout: str, *args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    done = subprocess.run(["git", "-C", checkout, *args], capture_output=True, text=True,
                          check=False)
    if check and done.returncode != 0:
        raise click.ClickException(f"git {' '.join(args[:1])} failed: {done.stderr.strip()}")
    return done
