"""The driver: snapshot a live kernel, or restore into one, from outside the kernel.

It speaks the Jupyter kernel protocol to the kernel named by a connection file. It sends
one ``execute_request`` whose code is a single expression (so the user's namespace gains
no name and IPython's ``_``/``Out`` do not change; ``store_history=False`` keeps ``In``
and the execution count as they were) that runs ``inkernel.serve`` in a private
namespace; the JSON result comes back in the reply's ``user_expressions``, the one
channel that is tied to this request and carries no output.

``silent=False`` on purpose: the kernel then broadcasts ``execute_input`` when our request
*starts*, which lets a timeout say whether the kernel was still busy with the user's cell
(our request never started) or the capture itself was too slow.

Failure handling:

- a busy kernel queues the request behind the running cell; ``timeout`` covers the wait.
  The kernel also gets the deadline, so a request that starts (or is still uploading)
  after the driver gave up stops by itself instead of writing a late snapshot;
- a kernel that stops answering heartbeats for a few seconds, or is restarted under us
  (its session id, asked for on the control channel every second, changes), raises
  :class:`KernelUnavailable`;
- a request aborted because the user's running cell failed is sent again;
- an exception in the kernel raises :class:`CaptureFailed`/:class:`RestoreFailed` (or the
  same class as in the kernel, e.g. :class:`SnapshotIntegrityError`) whose message ends
  with the last line of the remote traceback.
"""

from __future__ import annotations

import ast
import json
import os
import re
import time
import uuid
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import zmq
from jupyter_client.blocking.client import BlockingKernelClient

from . import inkernel, layout, staging
from .errors import (
    CaptureFailed,
    KernelUnavailable,
    ManifestError,
    ObjectNotFound,
    RestoreFailed,
    RestoreRefused,
    SnapshotError,
    SnapshotIntegrityError,
    SnapshotTimeout,
    StorageError,
    TransientStorageError,
)
from .storage import emulator_from_env, get_store

Progress = Callable[[int, int], None]

# The directory that holds the ``runtime`` package: a kernel whose environment cannot
# import ``runtime.snapshot`` (started without this project installed) imports it from
# here. Both sides run on the same host (node agent) or share the image (sidecar).
SOURCE_ROOT = str(Path(__file__).resolve().parents[2])

_HEARTBEAT_GRACE_S = 5.0
_PROBE_EVERY_S = 1.0
_POLL_MS = 200
_MAX_ABORTED_RETRIES = 3
_ANSI = re.compile(r"\x1b\[[0-9;]*[A-Za-z]")

_BOOTSTRAP = """\
import sys
try:
    from runtime.snapshot import inkernel
except ModuleNotFoundError as error:
    if error.name not in ("runtime", "runtime.snapshot", "runtime.snapshot.inkernel"):
        raise
    sys.path.append(source_root)
    from runtime.snapshot import inkernel
inkernel.serve(user_ns, request)
"""

_REMOTE_ERRORS: dict[str, type[SnapshotError]] = {
    cls.__name__: cls
    for cls in (
        SnapshotIntegrityError,
        RestoreRefused,
        SnapshotTimeout,
        ObjectNotFound,
        StorageError,
        ManifestError,
        KernelUnavailable,
        TransientStorageError,
    )
}


def snapshot_kernel(
    connection_file: str,
    *,
    bucket: str,
    prefix: str,
    kernel_id: str,
    timeout: float,
    progress: Progress | None = None,
    emulator_host: str | None = None,
    part_bytes: int = layout.DEFAULT_PART_BYTES,
    reuse: Mapping[str, int] | None = None,
    streams: int | None = None,
    access_token: str | None = None,
) -> dict[str, Any]:
    """Capture the kernel's user namespace into the part pool of the snapshot at
    ``gs://bucket/prefix`` (parts named in ``reuse``, digest -> bytes, are not sent again).

    Returns the kernel entry for the workspace manifest (see ``inkernel.capture``). Writes
    no manifest. ``timeout`` (seconds) covers waiting behind a busy cell plus the capture.
    ``progress(done_bytes, total_bytes)`` is called in this thread while parts upload.
    ``emulator_host`` defaults to this process's ``STORAGE_EMULATOR_HOST`` and is handed
    to the kernel explicitly, as is ``access_token`` (the only credential the kernel then
    uses: on GKE the monitor's downscoped token for this snapshot).
    """
    layout.normalize_prefix(prefix)  # fail here, not in the kernel, on bad names
    layout.check_kernel_id(kernel_id)
    args = {
        "bucket": bucket,
        "prefix": prefix,
        "kernel_id": kernel_id,
        "emulator_host": emulator_host or emulator_from_env(),
        "part_bytes": part_bytes,
        "reuse": dict(reuse or {}),
        "streams": streams,
    }
    if access_token:
        args["access_token"] = access_token
    return _call(connection_file, "capture", args, timeout=timeout, progress=progress)


def restore_kernel(
    connection_file: str,
    entry: Mapping[str, Any],
    *,
    bucket: str,
    timeout: float,
    progress: Progress | None = None,
    emulator_host: str | None = None,
    device_arrays_to_cpu: bool = False,
    streams: int | None = None,
    staged: list[str] | None = None,
    access_token: str | None = None,
) -> dict[str, Any]:
    """Restore a kernel entry's variables into the kernel behind ``connection_file``.

    ``staged``: the entry already downloaded and verified by :func:`staging.stage` (the
    kernel maps those files instead of downloading).

    Returns ``{"kernel_id", "variables", "skipped", "bytes", "seconds", "timings"}``.
    Raises :class:`SnapshotIntegrityError` (namespace untouched) if any stored part does
    not match its recorded size or digest, and :class:`RestoreRefused` if the kernel lacks
    the accelerator its device arrays need (``device_arrays_to_cpu`` puts them on CPU).
    """
    inkernel.check_entry(entry)
    args = {
        "entry": dict(entry),
        "bucket": bucket,
        "emulator_host": emulator_host or emulator_from_env(),
        "device_arrays_to_cpu": device_arrays_to_cpu,
        "streams": streams,
        "staged": staged,
    }
    if access_token:
        args["access_token"] = access_token
    return _call(connection_file, "restore", args, timeout=timeout, progress=progress)


def stage_kernel(
    entry: Mapping[str, Any],
    *,
    bucket: str,
    directory: str,
    timeout: float,
    progress: Progress | None = None,
    emulator_host: str | None = None,
    uid: int | None = None,
    access_token: str | None = None,
) -> list[str] | None:
    """Download a kernel entry ahead of its kernel, into files under ``directory``
    (:func:`staging.stage`, owned by ``uid`` when given): the paths for
    :func:`restore_kernel`'s ``staged``, or None when the entry is not staged (the kernel
    downloads it then)."""
    inkernel.check_entry(entry)
    store = get_store(emulator_host or emulator_from_env(), access_token=access_token)
    return staging.stage(store, bucket, entry,
                         Path(directory), deadline=time.time() + timeout, progress=progress,
                         uid=uid)


# -- protocol ------------------------------------------------------------------------------


def _connect(connection_file: str) -> BlockingKernelClient:
    if not os.path.exists(connection_file):
        raise KernelUnavailable(
            f"connection file {connection_file} does not exist: the kernel is not running"
        )
    client = BlockingKernelClient(connection_file=connection_file)
    try:
        client.load_connection_file()
    except (OSError, ValueError, KeyError) as error:
        raise KernelUnavailable(
            f"cannot read connection file {connection_file}: {error}"
        ) from error
    client.start_channels(shell=True, iopub=True, stdin=False, hb=True, control=True)
    return client


def _remote_error(op: str, content: Mapping[str, Any]) -> SnapshotError:
    ename = str(content.get("ename", "Error"))
    evalue = str(content.get("evalue", ""))
    lines = [_ANSI.sub("", line) for line in content.get("traceback") or []]
    flat = [text for line in lines for text in line.splitlines() if text.strip()]
    last = flat[-1].strip() if flat else f"{ename}: {evalue}"
    cls = _REMOTE_ERRORS.get(ename)
    if cls is not None:
        return cls(f"{op} failed: {evalue}")
    failed = CaptureFailed if op == "capture" else RestoreFailed
    return failed(f"{op} failed in the kernel: {last}")


def _parse_result(op: str, content: Mapping[str, Any]) -> dict[str, Any]:
    expression = (content.get("user_expressions") or {}).get("stasis", {})
    if expression.get("status") != "ok":
        raise _remote_error(op, expression)
    try:
        result: dict[str, Any] = json.loads(ast.literal_eval(expression["data"]["text/plain"]))
    except (KeyError, ValueError, SyntaxError) as error:
        failed = CaptureFailed if op == "capture" else RestoreFailed
        raise failed(f"{op}: unreadable result from the kernel: {error}") from error
    return result


def _progress_from(text: str, progress: Progress | None) -> None:
    if progress is None:
        return
    for line in text.splitlines():
        parts = line.split()
        if len(parts) == 3 and parts[0] == inkernel.PROGRESS_TAG:
            try:
                progress(int(parts[1]), int(parts[2]))
            except ValueError:
                continue


def _execute_once(
    client: BlockingKernelClient,
    op: str,
    args: Mapping[str, Any],
    *,
    until: float,
    progress: Progress | None,
) -> dict[str, Any]:
    """Send one request and wait for its reply until ``until`` (monotonic)."""
    token = uuid.uuid4().hex
    request = {
        **args,
        "op": op,
        "token": token,
        "deadline": time.time() + (until - time.monotonic()),
        "progress": progress is not None,
    }
    code = (
        f"exec({_BOOTSTRAP!r}, {{'user_ns': globals(), "
        f"'request': {json.dumps(request)!r}, 'source_root': {SOURCE_ROOT!r}}})"
    )
    expression = f"__import__('runtime.snapshot.inkernel', fromlist=['_']).take_result({token!r})"
    msg_id = client.execute(
        code,
        silent=False,
        store_history=False,
        user_expressions={"stasis": expression},
        allow_stdin=False,
        stop_on_error=False,
    )
    shell, iopub, control = client.shell_channel, client.iopub_channel, client.control_channel
    poller = zmq.Poller()
    for channel in (shell, iopub, control):
        poller.register(channel.socket, zmq.POLLIN)
    started = False
    # Restarts: every kernel process has its own session id, which it puts in the header
    # of every message. We ask for it on the control channel (answered even while a cell
    # runs) about once a second; a different id means the kernel was restarted (by
    # jupyter-server after a crash or OOM kill) and our request died with the old one.
    kernel_session: str | None = None
    probed_at = 0.0
    silent_since: float | None = None
    while True:
        now = time.monotonic()
        remaining = until - now
        if remaining <= 0:
            if started:
                raise SnapshotTimeout(f"{op} started in the kernel but did not finish in time")
            raise SnapshotTimeout(
                f"{op} did not start in time: the kernel was busy running another cell"
            )
        if now - probed_at >= _PROBE_EVERY_S:
            probed_at = now
            control.send(client.session.msg("kernel_info_request"))
        ready = dict(poller.poll(min(_POLL_MS, max(1, int(remaining * 1000)))))
        while control.msg_ready():
            reply = control.get_msg(timeout=0)
            if reply["header"]["msg_type"] != "kernel_info_reply":
                continue
            session = reply["header"].get("session")
            kernel_session = kernel_session or session
            if session != kernel_session:
                raise KernelUnavailable(
                    f"the kernel restarted during the {op} and lost its state "
                    "(did it run out of memory?)"
                )
        while iopub.msg_ready():
            msg = iopub.get_msg(timeout=0)
            if msg.get("parent_header", {}).get("msg_id") != msg_id:
                continue
            kind = msg["header"]["msg_type"]
            if kind == "execute_input":
                started = True
            elif kind == "stream":
                _progress_from(msg["content"].get("text", ""), progress)
        if shell.socket in ready:
            while shell.msg_ready():
                reply = shell.get_msg(timeout=0)
                if (
                    reply.get("parent_header", {}).get("msg_id") == msg_id
                    and reply["header"]["msg_type"] == "execute_reply"
                ):
                    content: dict[str, Any] = reply["content"]
                    return content
        if client.hb_channel.is_beating():
            silent_since = None
        else:
            silent_since = silent_since or time.monotonic()
            if time.monotonic() - silent_since > _HEARTBEAT_GRACE_S:
                raise KernelUnavailable(
                    f"the kernel stopped answering heartbeats during the {op} "
                    "(it died, or the connection file is stale)"
                )


def _call(
    connection_file: str,
    op: str,
    args: Mapping[str, Any],
    *,
    timeout: float,
    progress: Progress | None,
) -> dict[str, Any]:
    if timeout <= 0:
        raise ValueError("timeout must be positive")
    until = time.monotonic() + timeout
    client = _connect(connection_file)
    try:
        for _attempt in range(_MAX_ABORTED_RETRIES + 1):
            content = _execute_once(client, op, args, until=until, progress=progress)
            status = content.get("status")
            if status == "ok":
                return _parse_result(op, content)
            if status == "error":
                raise _remote_error(op, content)
            # "aborted": a cell queued before ours failed and the kernel dropped the
            # queue; our request never ran, so sending it again is safe.
        raise (CaptureFailed if op == "capture" else RestoreFailed)(
            f"{op} was aborted by the kernel {_MAX_ABORTED_RETRIES + 1} times "
            "(cells queued before it kept failing)"
        )
    finally:
        client.stop_channels()
