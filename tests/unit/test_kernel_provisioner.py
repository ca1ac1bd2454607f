"""When a workspace's jupyter-server may claim the warm kernel offered in its runtime dir
(``runtime.local.kernel_provisioner.claimable``); the claim itself, interrupt and restart
run against real servers in tests/integration/test_warm_kernels.py."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from runtime.local.kernel_provisioner import OFFER, claimable
from runtime.local.prekernel import OFFER as OFFERED


def _home(tmp_path: Path, pid: int) -> tuple[list[str], Path]:
    runtime = tmp_path / "runtime"
    runtime.mkdir()
    venv = tmp_path / "home" / ".venv"
    (venv / "lib" / "python3.11" / "site-packages").mkdir(parents=True)
    (venv / "pyvenv.cfg").write_text("home = /usr/bin\n")
    (runtime / OFFER).write_text(json.dumps({"pid": pid, "python": sys.executable,
                                             "fifo": str(runtime / "f"),
                                             "imported": ["numpy", "ipykernel"]}))
    conn = str(runtime / "kernel-1.json")
    return [str(venv / "bin" / "python"), "-m", "ipykernel_launcher", "-f", conn], runtime


def test_the_venvs_own_kernel_command_may_claim_a_live_offer(tmp_path: Path) -> None:
    assert OFFER == OFFERED  # the provisioner reads what the warm kernel writes
    cmd, runtime = _home(tmp_path, os.getpid())
    offer = claimable(cmd, runtime)
    assert offer is not None and offer["pid"] == os.getpid()


def test_another_command_or_a_dead_offer_is_not_claimed(tmp_path: Path) -> None:
    cmd, runtime = _home(tmp_path, os.getpid())
    assert claimable([cmd[0], "-m", "my_kernel", "-f", cmd[4]], runtime) is None
    assert claimable([*cmd, "--debug"], runtime) is None
    gone = subprocess.Popen([sys.executable, "-c", "pass"])
    gone.wait()
    (runtime / OFFER).write_text(json.dumps({"pid": gone.pid, "imported": []}))
    assert claimable(cmd, runtime) is None
    (runtime / OFFER).unlink()
    assert claimable(cmd, runtime) is None  # nothing offered: a cold start


def test_a_home_with_its_own_copy_of_a_preloaded_package_starts_cold(tmp_path: Path) -> None:
    """The warm kernel imported the environment's numpy; a home that installed its own
    must get it, so its kernel starts cold."""
    cmd, runtime = _home(tmp_path, os.getpid())
    site = Path(cmd[0]).parent.parent / "lib" / "python3.11" / "site-packages"
    (site / "requests").mkdir()  # not one the warm kernel imported: still claimable
    assert claimable(cmd, runtime) is not None
    (site / "numpy").mkdir()
    assert claimable(cmd, runtime) is None


def test_the_homes_kernel_spec_names_the_provisioner_and_keeps_a_users_edit(
    tmp_path: Path,
) -> None:
    """This interpreter has the entry point (pyproject), so the spec names it; a spec of
    ours from before is upgraded; one the user edited is left as it is (cold kernels)."""
    from runtime.local import userenv

    home = tmp_path / "home"
    userenv.ensure(home, sys.executable)
    spec = home / ".venv" / "share" / "jupyter" / "kernels" / "python3" / "kernel.json"
    assert json.loads(spec.read_text())["metadata"]["kernel_provisioner"] == {
        "provisioner_name": "stasis-warm"}
    assert userenv.claims_warm_kernels(home)
    older = json.loads(spec.read_text())
    del older["metadata"]["kernel_provisioner"]
    spec.write_text(json.dumps(older))
    assert not userenv.claims_warm_kernels(home)
    userenv.ensure(home, sys.executable)
    assert userenv.claims_warm_kernels(home)
    spec.write_text(json.dumps({**older, "env": {"MINE": "1"}}))
    userenv.ensure(home, sys.executable)
    assert json.loads(spec.read_text())["env"] == {"MINE": "1"}
    assert not userenv.claims_warm_kernels(home)
