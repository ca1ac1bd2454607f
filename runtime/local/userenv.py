"""A workspace's own packages: a venv in its home, layered on the environment.

``pip install x`` in a workspace (a terminal, ``%pip`` in a notebook) must land in the
workspace's home, never in an interpreter other workspaces (or the node agent) share. So
each home holds ``.venv``, whose interpreter runs the workspace's server and kernels:

- made with ``--without-pip`` (once per home), then layered on the environment's
  interpreter by a ``.pth`` file that adds that interpreter's own site-packages as site
  directories (their ``.pth`` files, editable installs among them, included). This is what
  ``--system-site-packages`` would do, except that it also works when the environment is
  itself a venv (the agent's default), where ``--system-site-packages`` would expose the
  venv's *base* interpreter instead. The home's site-packages come first on ``sys.path``,
  so a package installed there wins over the environment's copy;
- ``pip`` and ``pip3`` scripts in ``.venv/bin`` run the environment's pip with the home's
  interpreter, so pip installs where that interpreter's prefix is: the home.

The home is what survives pause, resume, ``stasis down``/``up`` and a resume on another
hardware profile, so the packages do too; another workspace has another home. The layer
(``.pth``) is written again whenever the home starts on another environment's interpreter
(``stasis-layer.json`` records which); a start on the same one runs no subprocess.

The home's kernel spec (``.venv/share/jupyter/kernels/python3``) runs the venv's
interpreter and, where the environment's interpreter has it, names the kernel provisioner
``stasis-warm`` (``runtime.local.kernel_provisioner``): the first kernel claims the warm
kernel the agent handed over, if any, and every other start is jupyter's own.

A workspace with a user of its own (``runtime.local.tenancy``) has its venv made by that
user (the subprocesses run through ``runtime.local.launch --user``) and owns what this
module writes, so its ``pip install`` can write there and nobody else's can.
"""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

VENV = ".venv"
_LAYER = "stasis-environment.pth"
#: What the layer was made from: a start on the same environment runs no subprocess.
_STAMP = "stasis-layer.json"
#: The kernel provisioner that claims a warm kernel (pyproject's entry point).
PROVISIONER = "stasis-warm"
_PIP = "#!{python}\nimport sys\nfrom pip._internal.cli.main import main\nsys.exit(main())\n"


class UserEnvError(RuntimeError):
    """The workspace's venv could not be made."""


def venv_dir(home: Path) -> Path:
    return home / VENV


@dataclass(frozen=True)
class UserEnv:
    """A home's venv: its interpreter, and what its server must be told so that Jupyter's
    data (JupyterLab's build, kernel specs) is still the environment's."""

    python: Path
    env: dict[str, str]


def ensure(home: Path, base_python: str, uid: int | None = None) -> UserEnv:
    """``home``'s venv, made (and layered on ``base_python``) if needed; with ``uid`` (the
    workspace's own user) made by that user and owned by it, so its pip installs there."""
    venv = venv_dir(home)
    made: list[Path] = []
    python = venv / "bin" / "python"
    stamp = venv / _STAMP
    base: dict[str, Any] | None = None
    if python.exists() and stamp.exists():
        with contextlib.suppress(ValueError, OSError):
            recorded = json.loads(stamp.read_text())
            if recorded.get("base") == base_python and "provisioner" in recorded:
                # a resume: nothing to run
                base = recorded
    if base is None:
        base = {"base": base_python, **_describe(base_python, uid)}
        if not python.exists():
            _run([base_python, "-m", "venv", "--without-pip", str(venv)], uid)
        own = _describe(str(python), uid)["site"]
        if not own:
            raise UserEnvError(f"the venv in {venv} has no site-packages")
        (Path(own[0]) / _LAYER).write_text("".join(
            f"import site; site.addsitedir({p!r})\n" for p in base["site"] if p not in own))
        for name in ("pip", "pip3"):
            script = venv / "bin" / name
            script.write_text(_PIP.format(python=python))
            script.chmod(0o755)
            made.append(script)
        stamp.write_text(json.dumps(base))
        made += [Path(own[0]) / _LAYER, stamp]
    # The home's own kernel spec comes first on JUPYTER_PATH: a server on another
    # interpreter (a warm one, runtime.local.warm) still starts kernels on the venv.
    # Its provisioner claims the warm kernel the agent handed over, when there is one
    # (runtime.local.kernel_provisioner), and starts cold otherwise; named only where the
    # environment's interpreter has it (jupyter_client refuses a spec naming a missing one).
    spec_dir = venv / "share" / "jupyter" / "kernels" / "python3"
    metadata: dict[str, Any] = {"debugger": True}
    if base.get("provisioner"):
        metadata["kernel_provisioner"] = {"provisioner_name": PROVISIONER}
    spec = json.dumps({
        "argv": [str(python), "-m", "ipykernel_launcher", "-f", "{connection_file}"],
        "display_name": "Python 3 (ipykernel)", "language": "python", "metadata": metadata})
    kernel_json = spec_dir / "kernel.json"
    with contextlib.suppress(OSError, ValueError):
        found = json.loads(kernel_json.read_text())
        ours = json.loads(spec)
        for either in (found, ours):
            either.get("metadata", {}).pop("kernel_provisioner", None)
        if found != ours or kernel_json.read_text() == spec:
            spec = ""  # the same, or the user's own edit: left as it is
    if spec:
        spec_dir.mkdir(parents=True, exist_ok=True)
        kernel_json.write_text(spec)
        made += [venv / "share", venv / "share" / "jupyter", spec_dir.parent, spec_dir,
                 kernel_json]
    if uid is not None:  # what this process wrote is the user's too
        for path in made:
            os.lchown(path, uid, uid)
    data = Path(base["prefix"]) / "share" / "jupyter"
    return UserEnv(python, {
        "JUPYTER_PATH": os.pathsep.join((str(venv / "share" / "jupyter"), str(data))),
        "JUPYTERLAB_DIR": str(data / "lab")})


def claims_warm_kernels(home: Path) -> bool:
    """Whether the home's kernel spec names the warm-kernel provisioner (a warm kernel
    handed to this workspace would be claimed)."""
    try:
        spec = json.loads((venv_dir(home) / "share" / "jupyter" / "kernels" / "python3"
                           / "kernel.json").read_text())
    except (OSError, ValueError):
        return False
    named = (spec.get("metadata") or {}).get("kernel_provisioner") or {}
    return bool(named.get("provisioner_name") == PROVISIONER)


def _describe(python: str, uid: int | None = None) -> dict[str, Any]:
    """An interpreter's prefix and site-packages directories (its venv's, if in one)."""
    out = _run([python, "-c", "import json, site, sys; from importlib.metadata import "
                "entry_points as e; print(json.dumps({'prefix': sys.prefix, "
                "'site': site.getsitepackages(), 'provisioner': any(p.name == "
                f"{PROVISIONER!r} for p in e(group='jupyter_client.kernel_provisioners'))}}))"],
               uid)
    found: dict[str, Any] = json.loads(out)
    return found


def _run(argv: list[str], uid: int | None = None) -> str:
    """``argv``'s output; as ``uid`` (through the launch trampoline) when given."""
    env = {"PATH": "/usr/bin:/bin", "LANG": "C.UTF-8"}
    if uid is not None:
        from runtime.local.tenancy import trampoline

        argv = [*trampoline(uid), *argv]
        env["PYTHONPATH"] = str(Path(__file__).resolve().parents[2])
    try:
        done = subprocess.run(argv, capture_output=True, text=True, timeout=60, check=False,
                              env=env, cwd="/" if uid is not None else None)
    except (OSError, subprocess.SubprocessError) as exc:
        raise UserEnvError(f"{argv[0]}: {exc}") from exc
    if done.returncode != 0:
        raise UserEnvError(f"{' '.join(argv[:3])} failed: {done.stderr.strip()[-500:]}")
    return done.stdout


if __name__ == "__main__":  # python -m runtime.local.userenv HOME [PYTHON]
    print(ensure(Path(sys.argv[1]), sys.argv[2] if len(sys.argv) > 2 else sys.executable))
