"""Playing the kubelet for a job's JobSet: its pods as processes of this machine.

``host_env`` gives the worker container's environment for one completion index exactly
as the JobSet (``functions.kubernetes.objects.jobset``) declares it, with the one mapping a single
machine needs: the pods' DNS names (``<job>-workers-0-<i>.<job>``) are 127.0.0.1, and the
rendezvous ports free ones (the JobSet's fixed ports may be taken on a shared machine).
``start_hosts`` runs the container's command with it.
"""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from functions.kubernetes.objects import jobset as js
from runtime.local.jobs import free_port

ROOT = Path(__file__).resolve().parents[2]


def worker_container(obj: Mapping[str, Any]) -> dict[str, Any]:
    job = obj["spec"]["replicatedJobs"][0]["template"]["spec"]
    return dict(job["template"]["spec"]["containers"][0])


def host_env(obj: Mapping[str, Any], host: int, torch_port: int,
             jax_port: int) -> dict[str, str]:
    name = obj["metadata"]["name"]
    hosts = obj["spec"]["replicatedJobs"][0]["template"]["spec"]["parallelism"]
    names = js.hostnames(name, hosts)
    env: dict[str, str] = {}
    for entry in worker_container(obj)["env"]:
        if "valueFrom" in entry:
            assert entry["valueFrom"]["fieldRef"]["fieldPath"] == js.COMPLETION_INDEX
            env[entry["name"]] = str(host)
            continue
        value = entry["value"]
        for dns in names:
            value = value.replace(dns, "127.0.0.1")
        env[entry["name"]] = value
    env["MASTER_PORT"] = str(torch_port)
    env["JAX_COORDINATOR_ADDRESS"] = f"127.0.0.1:{jax_port}"
    return env


def start_hosts(obj: Mapping[str, Any], extra: Mapping[str, str] | None = None
                ) -> list[subprocess.Popen[bytes]]:
    """Every host of the JobSet as a process running the container's command."""
    hosts = obj["spec"]["replicatedJobs"][0]["template"]["spec"]["parallelism"]
    command = [sys.executable if c == "python" else c for c in worker_container(obj)["command"]]
    torch_port, jax_port = free_port(), free_port()
    base = {"PATH": os.environ["PATH"], "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1"}
    return [subprocess.Popen(command, env={**base, **host_env(obj, i, torch_port, jax_port),
                                           **(extra or {})},
                             cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
            for i in range(hosts)]
