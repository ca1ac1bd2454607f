"""`stasis link create|list|revoke`, `stasis exec --link URL` and `stasis link sandbox`.

Links are issued by the ``links`` function (the CLI is one of its clients, chat another):
the CLI never sees Firestore for them, and the token exists only in the function's answer.
`stasis exec` and `stasis link sandbox` (an agent handing a task to a sandbox of the
team) need nothing but the link: pass it with ``--link`` or, better (a command line is
visible to every user of the machine in ``ps``), in ``STASIS_LINK``: the link is their
identity, so they take no ``--as``.
"""

from __future__ import annotations

import sys
from typing import Any

import click

from stack.settings import Settings
from stasis_cli import options
from stasis_cli.sandboxes import limits_of, task_options


def _links_call(settings: Settings, method: str, path: str, user: str, **kwargs: Any) -> Any:
    import requests

    url = f"{settings.functions_url}/links/{path.lstrip('/')}"
    try:
        response = requests.request(method, url, headers={"X-Stasis-User": user},
                                    timeout=30, **kwargs)
    except requests.RequestException as exc:
        raise click.ClickException(f"the links function did not answer ({exc}); is the "
                                   "stack up (`stasis status`)?") from None
    try:
        body = response.json()
    except ValueError:
        raise click.ClickException(f"links: HTTP {response.status_code}: "
                                   f"{response.text[:300]}") from None
    if response.status_code >= 400:
        raise click.ClickException(body.get("message") or body.get("error") or str(body))
    return body


@click.group()
def link() -> None:
    """Short-lived, revocable links that let a coding agent run code in a workspace."""


@link.command("create")
@click.argument("name")
@options.team
@click.option("--ttl", default=None, help="How long it works: 30m, 1h (default), 2h30m; "
                                          "capped by policy (12h).")
@click.option("--scope", type=click.Choice(["exec", "read", "sandbox"]), default="exec",
              show_default=True,
              help="exec: run code, use the Jupyter API and request sandboxes; read: read the "
                   "Jupyter API only; sandbox: request agent sandboxes for the team only.")
@options.as_user
@options.json_output
def link_create(name: str, team: str | None, ttl: str | None, scope: str,
                as_json: bool) -> None:
    """Create a link to workspace NAME; its URL (with the token) is shown once."""
    settings, ws_id, user = options.target(name, team)
    body = _links_call(settings, "POST", "/", user,
                       json={"workspace_id": ws_id, "scope": scope, "ttl": ttl})
    if as_json:
        options.echo_json(body)
        return
    for notice in body.get("notices") or []:
        click.echo(f"note: {notice}", err=True)
    click.echo(f"link {body['link_id']} to {ws_id} ({body['scope']}), expires "
               f"{body['expires_at']}")
    click.echo(f"  {body['url']}")
    click.echo("The URL carries the token and is shown only now (it is not stored). Give it "
               "to the agent, e.g.\n  STASIS_LINK='<url>' stasis exec 'print(1)'\n"
               f"Revoke it with: stasis link revoke {body['link_id']}")


@link.command("list")
@click.argument("name", required=False)
@options.team
@click.option("--all", "all_", is_flag=True, help="Include expired and revoked links.")
@options.as_user
@options.json_output
def link_list(name: str | None, team: str | None, all_: bool, as_json: bool) -> None:
    """Your links (a team admin: every link of the team), optionally of workspace NAME."""
    params: dict[str, str] = {"all": "1" if all_ else "0"}
    if name:
        settings, ws_id, user = options.target(name, team)
        params["workspace"] = ws_id
    else:
        settings, user = options.stack_settings(), options.acting_user()
        if team:
            params["team"] = team
    options.echo_rows(
        _links_call(settings, "GET", "/", user, params=params)["links"], as_json=as_json,
        empty="no links",
        line=lambda row: f"{row['link_id']}  {row['workspace_id']:<22} {row['scope']:<7} "
                         f"{row['status']:<8} {row['creator']:<8} expires "
                         f"{row['expires_at']}  uses {row['uses']}")


@link.command("revoke")
@click.argument("link_id")
@options.as_user
@options.json_output
def link_revoke(link_id: str, as_json: bool) -> None:
    """Revoke LINK_ID now: it stops working within a second, open streams included."""
    body = _links_call(options.stack_settings(), "DELETE", f"/{link_id}",
                       options.acting_user())
    if as_json:
        options.echo_json(body)
        return
    if body.get("error") == "already_revoked":
        click.echo(f"{link_id} was already revoked")
    else:
        click.echo(f"revoked {link_id} ({body.get('workspace_id')})")


@click.command("exec")
@click.option("--link", "link_url", envvar="STASIS_LINK", required=True,
              help="The link URL (or STASIS_LINK, which `ps` does not show).")
@click.option("-f", "--file", "script", type=click.File("r"),
              help="Run this file ('-': stdin) instead of CODE.")
@click.option("--notebook", default=None, help="Run in this notebook's kernel.")
@click.option("--kernel", "kernel_id", default=None, help="Run in this kernel.")
@click.option("--timeout", type=float, default=None, help="Interrupt the cell after SECONDS.")
@click.option("-v", "--verbose", is_flag=True, help="Say which kernel runs the code.")
@click.argument("code", required=False)
def exec_command(link_url: str, script: Any, notebook: str | None, kernel_id: str | None,
                 timeout: float | None, verbose: bool, code: str | None) -> None:
    """Run CODE (or -f FILE) in the linked workspace's kernel; output streams back and the
    exit status is the cell's: 0 ok, 1 it raised, 3 link refused, 4 workspace unavailable or
    rate-limited (worth a retry).
    A paused workspace is resumed first."""
    from stasis_cli import link_client

    if (code is None) == (script is None):
        raise click.UsageError("give CODE or -f FILE (one of them)")
    source = code if code is not None else script.read()
    sys.exit(link_client.run(link_url, source, notebook=notebook, kernel_id=kernel_id,
                             timeout=timeout, verbose=verbose))



_ENDED = ("SUCCEEDED", "FAILED", "TIMED_OUT", "KILLED")
#: `stasis link sandbox --wait`: the sandbox was suspended (idle) before it ended.
EXIT_SUSPENDED = options.EXIT_SUSPENDED


@link.command("sandbox")
@click.option("--link", "link_url", envvar="STASIS_LINK", required=True,
              help="The link URL (or STASIS_LINK); scope exec or sandbox.")
@task_options
@click.option("--id", "sandbox_id", default=None,
              help="Sandbox id (a retry with the same id is the same request).")
@click.option("--wait", is_flag=True, help="Follow it to its end and print the patch.")
@click.option("--wait-timeout", type=float, default=3600.0, show_default=True)
def link_sandbox(link_url: str, repository: str, command: str, base_ref: str,
                 allowed: tuple[str, ...], cpu_seconds: int | None, memory: str | None,
                 wall_clock: int | None, processes: int | None, idle: int | None,
                 disk: str | None, sandbox_id: str | None, wait: bool, wait_timeout: float) -> None:
    """As an agent holding a link: run COMMAND in a sandbox of the workspace's team (as the
    link's creator). Prints the sandbox id; with --wait, the patch on stdout (progress on
    stderr). Exit 0 succeeded, 1 the task failed, 3 link or request refused, 4 unavailable or
    rate-limited, 5 suspended for being idle (resume it, then wait again).
    Nothing is applied: `git apply` the patch yourself."""
    import time

    import requests

    from functions.domain.links import parse_link_url
    from stasis_cli import link_client

    try:
        address = parse_link_url(link_url)
    except ValueError as exc:
        raise click.UsageError(f"--link: {exc}") from None
    session = requests.Session()
    session.trust_env = False
    session.headers.update(link_client.auth_headers(address))
    url = f"{address.workspace_url}/stasis/sandboxes"
    limits = limits_of(cpu_seconds, memory, wall_clock, processes, idle, disk)
    body: dict[str, Any] = {"repository": repository, "command": command,
                            "base_ref": base_ref, "limits": limits,
                            "allowed_network": list(dict.fromkeys(allowed))}
    if sandbox_id:
        body["sandbox_id"] = sandbox_id

    def call(method: str, path: str = "", **kwargs: Any) -> Any:
        try:
            response = session.request(method, url + path, timeout=60, **kwargs)
            answer = response.json()
        except (requests.RequestException, ValueError) as exc:
            click.echo(f"the proxy did not answer ({exc})", err=True)
            sys.exit(link_client.EXIT_UNAVAILABLE)
        if response.status_code >= 400:
            click.echo(f"refused ({response.status_code} {answer.get('error')}): "
                       f"{answer.get('message')}", err=True)
            sys.exit(link_client.exit_for(response.status_code))
        return answer

    started = call("POST", json=body)
    sandbox_id = str(started["sandbox_id"])
    click.echo(f"{sandbox_id}: {started.get('state')} — {started.get('message')}", err=True)
    if not wait:
        click.echo(sandbox_id)
        return
    deadline = time.monotonic() + wait_timeout
    seen = (started.get("state"), started.get("queue_position"))
    while True:
        view = call("GET", f"/{sandbox_id}")
        if (view.get("state"), view.get("queue_position")) != seen:
            seen = (view.get("state"), view.get("queue_position"))
            click.echo(f"{sandbox_id}: {view.get('state')} — {view.get('message')}", err=True)
        if view.get("state") in _ENDED:
            break
        if view.get("state") == "SUSPENDED":
            click.echo(f"{sandbox_id} is suspended for being idle; resume it with POST "
                       f"{url}/{sandbox_id}/resume, then wait again", err=True)
            sys.exit(EXIT_SUSPENDED)
        if time.monotonic() > deadline:
            click.echo(f"{sandbox_id} has not ended after {wait_timeout:g} s", err=True)
            sys.exit(link_client.EXIT_UNAVAILABLE)
        time.sleep(1.0)
    if view.get("patch_truncated"):
        click.echo(f"the patch is larger than the proxy returns inline: "
                   f"`stasis sandbox show {sandbox_id}`", err=True)
    click.echo(view.get("patch") or "", nl=False)
    sys.exit(0 if view.get("state") == "SUCCEEDED" else 1)
