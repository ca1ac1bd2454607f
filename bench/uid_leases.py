"""What the host-wide uid leases (``runtime.local.uids``) add to a workspace's first start and
a sandbox start: one claim (flock, read the candidates' leases, scan the host's processes with
psutil, write one file), and one hold (a resume: flock, read, keep).

    python bench/uid_leases.py [--rounds 50] [--leased 100]

``--leased``: how many uids other agents already hold (so the claim reads that many leases
first). The leases live in a temporary directory; nothing on the host changes. Prints JSON
(milliseconds: p50 and max), with the host's process count and load average.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import tempfile
import time
from pathlib import Path

import psutil

from runtime.local.tenancy import UID_BASE
from runtime.local.uids import HostUids


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--rounds", type=int, default=50)
    parser.add_argument("--leased", type=int, default=100)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        root, other, mine = Path(tmp) / "uids", Path(tmp) / "other", Path(tmp) / "mine"
        other.mkdir()
        mine.mkdir()
        elsewhere = HostUids(other, root, in_use=set)
        for n in range(args.leased):
            elsewhere.claim(f"workspace:o--{n}", [UID_BASE + n])
        leases = HostUids(mine, root)
        claims, holds = [], []
        for n in range(args.rounds):
            key = f"workspace:m--{n}"
            began = time.perf_counter()
            uid = leases.claim(key, range(UID_BASE, UID_BASE + 50_000))
            claims.append((time.perf_counter() - began) * 1000)
            began = time.perf_counter()
            leases.hold(uid, key)
            holds.append((time.perf_counter() - began) * 1000)
            leases.release(uid, key)
    print(json.dumps({
        "claim_ms": {"p50": round(statistics.median(claims), 3), "max": round(max(claims), 3)},
        "hold_ms": {"p50": round(statistics.median(holds), 3), "max": round(max(holds), 3)},
        "rounds": args.rounds, "leased_elsewhere": args.leased,
        "host_processes": len(psutil.pids()), "load_average": os.getloadavg()[0],
    }))


if __name__ == "__main__":
    main()
