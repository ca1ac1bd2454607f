"""Helpers of the real-cluster tests (testcontainers' K3s module): loading a locally built
image into K3s without a registry, and waiting on the cluster."""

from __future__ import annotations

import io
import tarfile
import time
from collections.abc import Callable
from typing import Any


def import_image(client: Any, k3s: Any, tag: str) -> None:
    """Load a locally built image into K3s's containerd (no registry involved)."""
    data = b"".join(client.images.get(tag).save(named=True))
    archive = io.BytesIO()
    with tarfile.open(fileobj=archive, mode="w") as tar:
        info = tarfile.TarInfo("image.tar")
        info.size = len(data)
        tar.addfile(info, io.BytesIO(data))
    container = k3s.get_wrapped_container()
    container.put_archive("/tmp", archive.getvalue())
    result = container.exec_run(["ctr", "-n", "k8s.io", "images", "import", "/tmp/image.tar"])
    assert result.exit_code == 0, result.output.decode(errors="replace")


def until(check: Callable[[], Any], timeout: float, what: str) -> Any:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = check()
        if value:
            return value
        time.sleep(1)
    raise TimeoutError(f"{what}: not within {timeout:.0f}s")
