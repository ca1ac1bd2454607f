"""A model on the GPU: pause, resume, against reloading it from the home disk. Prints JSON.

In one run, on one device (``--device cuda`` on a GPU host, ``--device cpu`` anywhere):

1. a real kernel builds a torch model of ``--size`` bytes (4096 x 4096 float32 layers,
   weights created here: nothing is downloaded) on the device, and saves its
   ``state_dict`` to a file in the workspace's home, as a notebook would;
2. **pause**: the snapshot agent captures the kernel to fake-gcs-server (GPU storages go
   to host through bounded staging buffers); GiB/s, and the kernel's host memory above
   what it held before, against the bound ``(streams + 1) x part_bytes``;
3. **resume**: a fresh kernel gets the model back onto the same device; GiB/s, host
   memory, and the model's output compared with the original's;
4. **reload**: another fresh kernel builds the model and loads the state_dict from the
   home file onto the device (``torch.load`` + ``load_state_dict``), with the file's pages
   dropped from the page cache first (``posix_fadvise``), as after a restart;
5. the same bytes moved raw to the same server (the fastest of 1, 2, 4 streams).

Targets (issue 23, on a GPU): resume >= 5x faster than reload; capture and restore >= 0.8
of the raw transfer; host memory during capture <= the staging bound.

    .venv/bin/python bench/gpu_pause_resume.py --device cuda --size 4G
    .venv/bin/python bench/gpu_pause_resume.py --device cpu --size 1G
"""

from __future__ import annotations

import argparse
import json
import os
import tempfile
import time
import uuid
from pathlib import Path

from pause_resume import (
    GiB,
    Kernels,
    MiB,
    RawTransfers,
    fake_gcs,
    kernel_pid,
    parse_size,
    peak_rss,
    run_cell,
)

from runtime.snapshot import restore_kernel, snapshot_kernel
from runtime.snapshot.layout import DEFAULT_PART_BYTES, part_bytes_for
from runtime.snapshot.storage import ObjectStore
from runtime.snapshot.transfer import default_streams

LAYER_BYTES = 4096 * 4096 * 4 + 4096 * 4
BUILD = """
import torch
torch.manual_seed(0)
def build(layers):
    return torch.nn.Sequential(*[torch.nn.Linear(4096, 4096) for _ in range(layers)])
model = build({layers}).to({device!r})
probe = torch.ones(2, 4096, device={device!r})
expected = model(probe).sum().item()
torch.save(model.state_dict(), {path!r})
if {device!r}.startswith("cuda"):
    torch.cuda.synchronize()
"""
RELOAD = """
import os, time
started = time.perf_counter()
import torch
def build(layers):
    with torch.device("meta"):
        return torch.nn.Sequential(*[torch.nn.Linear(4096, 4096) for _ in range(layers)])
model = build({layers}).to_empty(device={device!r})
model.load_state_dict(torch.load({path!r}, map_location={device!r}, weights_only=True))
if {device!r}.startswith("cuda"):
    torch.cuda.synchronize()
reload_s = time.perf_counter() - started
probe = torch.ones(2, 4096, device={device!r})
print(reload_s, model(probe).sum().item())
"""
CHECK = """
import torch
print(str(next(model.parameters()).device), model(probe).sum().item(), expected)
"""
ACCELERATOR = ("import torch; print(torch.cuda.get_device_name(0) "
               "if torch.cuda.is_available() else 'none')")


def drop_from_page_cache(path: str) -> bool:
    """Evict ``path``'s pages (this file only), so the reload reads the disk."""
    try:
        with open(path, "rb") as handle:
            os.fsync(handle.fileno())
            os.posix_fadvise(handle.fileno(), 0, 0, os.POSIX_FADV_DONTNEED)
        return True
    except (OSError, AttributeError):
        return False


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", default="cuda", help="cuda, cuda:1, cpu")
    parser.add_argument("--size", default="1G", help="model size, e.g. 512M, 4G")
    parser.add_argument("--home", default=None, help="where the state_dict file goes")
    parser.add_argument("--emulator", default=None, help="use this fake-gcs-server URL")
    args = parser.parse_args()
    layers = max(1, parse_size(args.size) // LAYER_BYTES)
    size = layers * LAYER_BYTES
    home = Path(args.home or tempfile.mkdtemp(prefix="stasis-gpu-bench-"))
    path = str(home / "model.pt")
    load_before = os.getloadavg()[0]
    kernels = Kernels()
    with fake_gcs(args.emulator) as url:
        os.environ["STORAGE_EMULATOR_HOST"] = url
        store = ObjectStore(emulator_host=url)
        bucket = f"bench-{uuid.uuid4().hex[:8]}"
        store.client.create_bucket(bucket)
        try:
            source, client = kernels.start()
            started = time.perf_counter()
            run_cell(client, BUILD.format(layers=layers, device=args.device, path=path))
            build_s = time.perf_counter() - started
            accelerator = run_cell(client, ACCELERATOR)

            prefix = f"snapshots/bench/bench--gpu/{uuid.uuid4().hex[:8]}"
            with peak_rss(kernel_pid(source)) as capture_rss:
                started = time.perf_counter()
                entry = snapshot_kernel(source.connection_file, bucket=bucket, prefix=prefix,
                                        kernel_id="k", timeout=3600)
                capture_s = time.perf_counter() - started

            target, target_client = kernels.start()
            with peak_rss(kernel_pid(target)) as restore_rss:
                started = time.perf_counter()
                restore_kernel(target.connection_file, entry, bucket=bucket, timeout=3600)
                restore_s = time.perf_counter() - started
            device, got, expected = run_cell(target_client, CHECK).split()
            if abs(float(got) - float(expected)) > 1e-3 * max(1.0, abs(float(expected))):
                raise RuntimeError(f"the restored model differs: {got} != {expected}")
            kernels.stop(target)

            dropped = drop_from_page_cache(path)
            _reloader, reload_client = kernels.start()
            reload_s, reloaded = run_cell(
                reload_client, RELOAD.format(layers=layers, device=args.device, path=path)
            ).split()
            if abs(float(reloaded) - float(expected)) > 1e-3 * max(1.0, abs(float(expected))):
                raise RuntimeError("the reloaded model differs from the original")
        finally:
            kernels.close()
            Path(path).unlink(missing_ok=True)
        raw = RawTransfers(url, bucket, min(size, 4 * GiB), entry["part_bytes"], store)
        raw.run_once()
    scale = size / min(size, 4 * GiB)  # raw timings of at most 4 GiB, scaled up
    best_up = min(raw.upload_s.values()) * scale
    best_down = min(raw.download_s.values()) * scale
    streams = default_streams("upload")
    bound = (streams + 1) * part_bytes_for(size, DEFAULT_PART_BYTES)
    capture_extra = capture_rss[1] - capture_rss[0]
    gib = size / GiB
    print(json.dumps({
        "bench": "gpu_pause_resume",
        "device": args.device, "accelerator": accelerator, "restored_on": device,
        "machine": {"load_avg_1m_before_after": [round(load_before, 2),
                                                 round(os.getloadavg()[0], 2)],
                    "cpus": os.cpu_count()},
        "model": {"layers": layers, "bytes": size, "build_s": round(build_s, 3)},
        "capture": {"s": round(capture_s, 3), "gib_per_s": round(gib / capture_s, 3),
                    "uploaded_bytes": entry["uploaded_bytes"],
                    "host_extra_mib": round(capture_extra / MiB),
                    "host_bound_mib": round(bound / MiB)},
        "restore": {"s": round(restore_s, 3), "gib_per_s": round(gib / restore_s, 3),
                    "host_extra_mib": round((restore_rss[1] - restore_rss[0]) / MiB)},
        "reload_from_home_disk": {"s": round(float(reload_s), 3), "page_cache_dropped": dropped},
        "raw": {"upload_s": round(best_up, 3), "download_s": round(best_down, 3)},
        "ratios": {
            "reload_vs_restore": round(float(reload_s) / restore_s, 2),
            "capture_vs_raw_upload": round(best_up / capture_s, 3),
            "restore_vs_raw_download": round(best_down / restore_s, 3),
        },
        "targets_met": {
            "resume_5x_faster_than_reload": float(reload_s) / restore_s >= 5,
            "capture_at_least_0.8_of_raw": best_up / capture_s >= 0.8,
            "restore_at_least_0.8_of_raw": best_down / restore_s >= 0.8,
            "capture_host_memory_within_bound": capture_extra <= bound,
        },
    }, indent=1))


if __name__ == "__main__":
    main()
