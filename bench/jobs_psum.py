"""A local job's cost: submit -> result for a cross-host sum on 1 and on 4 hosts (prints JSON).

Runs ``stasis.jobs.submit`` without a control plane, as a notebook on the local runtime
does, for each framework: ``jax`` (every host joins ``jax.distributed`` with gloo CPU
collectives and a loopback coordinator; the function psums over the global devices) and
``torch`` (a gloo process group; the function all-reduces one tensor). The wall time is
submit to ``result()``: processes started, the framework imported, the rendezvous, the
collective, the clean leave. The first run of each shape warms the page cache and is
dropped. On a 2-core machine 4 hosts share 2 cores, so this is a floor for the overhead,
not a speed.

    .venv/bin/python bench/jobs_psum.py [--runs 5] [--hosts 1 4] [--frameworks jax torch]
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from importlib.util import find_spec
from typing import Any

import stasis.jobs


def jax_sum(base: int) -> float:
    import jax
    import jax.numpy as jnp

    x = jnp.array([float(base + jax.process_index())])
    return float(jax.pmap(lambda v: jax.lax.psum(v, "h"), axis_name="h")(x)[0])


def torch_sum(base: int) -> float:
    import torch
    import torch.distributed as dist

    t = torch.tensor([float(base + dist.get_rank())])
    dist.all_reduce(t)
    return float(t.item())


def one(framework: str, hosts: int) -> float:
    fn = jax_sum if framework == "jax" else torch_sum
    start = time.perf_counter()
    job = stasis.jobs.submit(fn, 10, hosts=hosts, framework=framework, control_plane=None)
    value = job.result(timeout=300)
    elapsed = time.perf_counter() - start
    expected = float(sum(10 + r for r in range(hosts)))
    if value != expected:
        raise SystemExit(f"{framework} x {hosts}: got {value}, expected {expected}")
    return elapsed


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--hosts", type=int, nargs="+", default=[1, 4])
    parser.add_argument("--frameworks", nargs="+", default=["jax", "torch"])
    ns = parser.parse_args()
    results: dict[str, Any] = {}
    for framework in ns.frameworks:
        if find_spec(framework) is None:
            results[framework] = "not installed"
            continue
        for hosts in ns.hosts:
            one(framework, hosts)  # warm-up
            runs = sorted(one(framework, hosts) for _ in range(ns.runs))
            results[f"{framework}_hosts_{hosts}_s"] = {
                "median": round(statistics.median(runs), 2), "min": round(runs[0], 2),
                "max": round(runs[-1], 2), "runs": ns.runs}
    print(json.dumps(results, indent=2))


if __name__ == "__main__":
    main()
