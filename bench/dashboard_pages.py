"""Dashboard page loads over a seeded fleet at growing sizes: time and reads per page.

Starts a Firestore emulator on a free port, seeds the tests' realistic fleet
(tests/integration/dashboard_fleet.py) at each scale (1 = 300 workspaces), calls the
dashboard function in-process (the functions-framework app, as the function host mounts
it) for every page, and prints JSON: per scale and page, the median render time over
``--runs`` loads and the documents, queries and aggregation queries one load performed.
What should hold: reads per page do not grow with the fleet (bounded pages, counts by
aggregation).

    .venv/bin/python bench/dashboard_pages.py [--scales 1,10] [--runs 5]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import sys
import tempfile
import time
from datetime import UTC, datetime
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests" / "integration"))

PAGES = ("fleet", "fleet?team=ml-a&state=PAUSED", "snapshots", "cost", "latency", "links",
         "sandboxes", "audit", "audit?actor=idle-policy")


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--scales", default="1,10")
    parser.add_argument("--runs", type=int, default=5)
    args = parser.parse_args()

    from stack.processes import firestore_spec, free_ports, start_many, stop_all
    from stack.settings import Settings

    data_dir = Path(tempfile.mkdtemp(prefix="stasis-bench-dashboard-"))
    settings = Settings(project="bench", data_dir=data_dir).with_ports(
        {"firestore": free_ports(1)[0]})
    start_many([firestore_spec(settings)], timeout=90)
    try:
        os.environ.update({"FIRESTORE_EMULATOR_HOST": settings.firestore_host,
                           "STASIS_DASHBOARD_DEV_USER": "dev",
                           # a platform admin: every page reads the whole fleet
                           "STASIS_PLATFORM_ADMINS": "dev"})
        results = [_measure(int(s), args.runs) for s in args.scales.split(",")]
        print(json.dumps({"runs": args.runs, "results": results}, indent=2))
    finally:
        stop_all(data_dir)
        shutil.rmtree(data_dir, ignore_errors=True)


def _measure(scale: int, runs: int) -> dict[str, object]:
    import functions_framework
    from dashboard_fleet import build_fleet, write_fleet
    from werkzeug.test import Client

    project = f"bench-dash-{scale}-{int(time.time())}"
    os.environ["GOOGLE_CLOUD_PROJECT"] = os.environ["STASIS_PROJECT"] = project
    mark = time.monotonic()
    fleet = build_fleet(project, datetime.now(UTC), scale=scale)
    write_fleet(fleet)
    seeded = time.monotonic() - mark
    app = functions_framework.create_app(target="dashboard",
                                         source=str(ROOT / "functions" / "main.py"),
                                         signature_type="http")
    client = Client(app)
    client.get("/")  # warm: the client and its channel
    pages = {}
    for page in PAGES:
        times, reads = [], ""
        for _ in range(runs):
            started = time.monotonic()
            response = client.get("/" + page)
            times.append((time.monotonic() - started) * 1000)
            assert response.status_code == 200, (page, response.status_code)
            reads = response.headers["X-Stasis-Reads"]
        pages[page] = {"median_ms": round(statistics.median(times)), "reads": reads}
    return {"scale": scale, "workspaces": len(fleet.workspaces),
            "snapshots": len(fleet.snapshots), "audit": len(fleet.audit),
            "links": len(fleet.links), "seed_seconds": round(seeded, 1), "pages": pages}


if __name__ == "__main__":
    main()
