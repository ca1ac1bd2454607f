"""Incremental snapshots: what the 2nd, 3rd and 10th pause of a workspace send. Prints JSON.

A real kernel holds a state of the given size: 64 float32 arrays ("weights"), like a
model's tensors. Between two pauses 1% of the state's bytes change (a contiguous run of
one array, a different place each time, as a training step or an edit would change them).
Each pause is a snapshot of that kernel into a fresh prefix of the same workspace, taking
the previous one as its base, exactly as the control plane asks the node agent to
(``Snapshot(base=current snapshot)``); its manifest is written as the node agent writes
it. For each pause: bytes sent against the state's size, capture seconds; at the end, the
bytes the workspace's ten snapshots hold together (each shared part once: what the team is
charged, ``functions.domain.retention.held_bytes``) against ten full copies; and the last
snapshot restored into a fresh kernel and checked.

    .venv/bin/python bench/incremental_snapshots.py --sizes 256M,1G --pauses 10

It starts its own fake-gcs-server (in memory) unless ``--emulator URL`` is given.
"""

from __future__ import annotations

import argparse
import json
import os
import time
import uuid
from typing import Any

from pause_resume import GiB, Kernels, MiB, fake_gcs, parse_size, run_cell

from runtime.snapshot import (
    manifest_parts,
    restore_kernel,
    reusable_parts,
    snapshot_kernel,
    write_manifest,
)
from runtime.snapshot.storage import ObjectStore

ARRAYS = 64
BUILD = """
import numpy as np
rng = np.random.default_rng(11)
weights = {{f"layer{{i}}": rng.standard_normal({per} // 4, dtype=np.float32)
            for i in range({arrays})}}
step = 0
"""
# 1% of the state's bytes, contiguous, in one array: a different array each pause.
CHANGE = """
layer = weights[f"layer{{{pause} * 7 % {arrays}}}"]
start = ({pause} * 7919) % max(1, layer.size - {count})
layer[start:start + {count}] += 1.0
step = {pause}
"""
DIGEST = ("print(__import__('hashlib').sha256(b''.join(w.tobytes() for w in "
          "weights.values())).hexdigest(), step)")


def bench_size(size: int, pauses: int, url: str, bucket: str, store: ObjectStore
               ) -> dict[str, Any]:
    per = size // ARRAYS
    workspace = f"snapshots/bench/bench--{uuid.uuid4().hex[:8]}"
    kernels = Kernels()
    rows: list[dict[str, Any]] = []
    held: dict[str, int] = {}
    try:
        _manager, client = kernels.start()
        source = kernels.started[-1][0]
        run_cell(client, BUILD.format(per=per, arrays=ARRAYS))
        base: dict[str, Any] | None = None
        for pause in range(1, pauses + 1):
            if pause > 1:
                count = max(1, size // 100 // 4)  # float32 elements in 1% of the bytes
                run_cell(client, CHANGE.format(pause=pause, arrays=ARRAYS, count=count))
            prefix = f"{workspace}/snap-{pause}"
            started = time.perf_counter()
            entry = snapshot_kernel(source.connection_file, bucket=bucket, prefix=prefix,
                                    kernel_id="k", timeout=600,
                                    reuse=reusable_parts(base) if base else None)
            seconds = time.perf_counter() - started
            base = write_manifest(bucket, prefix, {"kernels": [
                {"kernel_id": "k", "kernelspec": "python3", "entry": entry}]}, store=store)
            held.update(manifest_parts(base))
            rows.append({"pause": pause, "state_bytes": entry["total_bytes"],
                         "uploaded_bytes": entry["uploaded_bytes"],
                         "uploaded_vs_state": round(entry["uploaded_bytes"]
                                                    / entry["total_bytes"], 4),
                         "capture_s": round(seconds, 3), "parts": len(entry["objects"])})
        expected = run_cell(client, DIGEST)
        _target_manager, target_client = kernels.start()
        target = kernels.started[-1][0]
        started = time.perf_counter()
        assert base is not None
        restore_kernel(target.connection_file, base["kernels"][0]["entry"], bucket=bucket,
                       timeout=600)
        restore_s = time.perf_counter() - started
        if run_cell(target_client, DIGEST) != expected:
            raise RuntimeError("the last incremental snapshot restored a different state")
    finally:
        kernels.close()
    state = rows[0]["state_bytes"]
    return {
        "size_bytes": size,
        "arrays": ARRAYS,
        "change_per_pause": "1% of the bytes, contiguous, one array",
        "pauses": {str(r["pause"]): r for r in rows if r["pause"] in (1, 2, 3, pauses)},
        "all_uploaded_vs_state": [r["uploaded_vs_state"] for r in rows],
        "workspace_holds_bytes": sum(held.values()),
        "full_copies_bytes": state * pauses,
        "holds_vs_full_copies": round(sum(held.values()) / (state * pauses), 4),
        "last_snapshot_restore_s": round(restore_s, 3),
        "restored_state_matches": True,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", default="256M,1G", help="state sizes, e.g. 256M,1G")
    parser.add_argument("--pauses", type=int, default=10)
    parser.add_argument("--emulator", default=None, help="use this fake-gcs-server URL")
    args = parser.parse_args()
    load_before = os.getloadavg()[0]
    with fake_gcs(args.emulator) as url:
        os.environ["STORAGE_EMULATOR_HOST"] = url
        store = ObjectStore(emulator_host=url)
        bucket = f"bench-{uuid.uuid4().hex[:8]}"
        store.client.create_bucket(bucket)
        results = [bench_size(parse_size(s), args.pauses, url, bucket, store)
                   for s in args.sizes.split(",") if s.strip()]
    print(json.dumps({
        "bench": "incremental_snapshots",
        "machine": {"load_avg_1m_before_after": [round(load_before, 2),
                                                 round(os.getloadavg()[0], 2)],
                    "cpus": os.cpu_count()},
        "units": {"MiB": MiB, "GiB": GiB},
        "results": results,
    }, indent=1))


if __name__ == "__main__":
    main()
