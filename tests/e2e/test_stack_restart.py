"""`stasis down` then `stasis up`: the workspaces come back PAUSED, with their kernels.

The Firestore emulator keeps data in memory; `down` pauses the running workspaces and
saves the emulator's state in the data dir, `up` loads it (``stack.persistence``).
"""

from __future__ import annotations

import contextlib
import json

from harness.notebook import Notebook
from stack import local, persistence
from tests.e2e.conftest import start_stack


def _status(stack, name: str) -> dict:
    return json.loads(stack.cli("ws", "status", name, "--team", "ml-a", "--json").stdout)


def test_down_pauses_and_saves_and_up_brings_the_workspace_back(tmp_path):
    gen = start_stack(tmp_path / "s", "local")
    stack = next(gen)
    try:
        stack.cli("ws", "create", "keep", "--team", "ml-a", "--wait")
        info = _status(stack, "keep")
        nb = Notebook(info["direct_url"], info["token"])
        kernel = nb.open("work.ipynb")
        nb.run(kernel, "answer = 6 * 7")

        said: list[str] = []
        local.down(stack.settings, say=said.append)
        assert local.status(stack.settings) == []
        assert persistence.import_file(stack.settings) is not None
        assert any("pausing 1 running workspace" in line for line in said), said
        assert any("ml-a--keep: PAUSED" in line for line in said), said

        report = local.up(stack.settings, runtime="local")
        assert report.restored and not report.seeded  # the catalog came back too
        assert _status(stack, "keep")["state"] == "PAUSED"
        stack.cli("ws", "resume", "keep", "--team", "ml-a", "--wait")
        info = _status(stack, "keep")
        nb = Notebook(info["direct_url"], info["token"])
        assert nb.run(nb.open("work.ipynb"), "print(answer)").stdout.strip() == "42"

        local.down(stack.settings, pause=False)
        report = local.up(stack.settings, runtime="local", fresh=True)
        assert not report.restored and report.seeded
        assert stack.cli("ws", "status", "keep", "--team", "ml-a", "--json",
                         check=False).returncode != 0
    finally:
        with contextlib.suppress(StopIteration):
            next(gen)
