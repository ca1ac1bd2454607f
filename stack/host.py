"""The function host of the local stack: every function of functions/main.py in ONE process.

Each function gets its own functions-framework app (exactly what it gets when deployed),
mounted at ``/<function name>``; a push subscription per function posts to that path.
One process instead of one per function: on this 2-core machine one host starts in about
the time one function does and uses one interpreter's memory instead of N (see
bench/function_host.py for the numbers), and the functions stay isolated where it matters:
each has its own app, route and dead-letter topic. Each worker builds its clients and
opens its Firestore channel before it serves (``bootstrap.warm``), as an instance kept
warm would: the first workspace after a start is not the slow one.

Run: ``gunicorn -k gthread --workers 2 --threads 8 -b 127.0.0.1:PORT stack.host:app``
(``stack.local.host_spec``; the workers are separate instances that share only the
emulators).

For finding where a worker's memory goes (``bench/load.py --trace-memory``): with
``STASIS_HOST_TRACEMALLOC=N`` each worker traces its allocations (N frames) and answers
``GET /_memory`` with its pid and, after a full garbage collection, the allocation sites
that grew most since its baseline (``?baseline=1`` takes one; ``?referrers=TYPE``: how
many instances of a type live and what holds them). Off by default: tracing slows every
allocation.
"""

from __future__ import annotations

import gc
import json
import os
import tracemalloc
from pathlib import Path
from typing import Any

import functions_framework
from werkzeug.middleware.dispatcher import DispatcherMiddleware
from werkzeug.wrappers import Response

from functions import bootstrap
from functions.routes import HTTP_FUNCTIONS, ROUTES

MAIN = Path(__file__).resolve().parent.parent / "functions" / "main.py"


def _health(environ: dict[str, Any], start_response: Any) -> Any:
    return Response("ok\n", mimetype="text/plain")(environ, start_response)


class _Memory:
    """``GET /_memory``: this worker's allocation sites that grew since its baseline."""

    def __init__(self) -> None:
        self.baseline: tracemalloc.Snapshot | None = None

    def __call__(self, environ: dict[str, Any], start_response: Any) -> Any:
        query = environ.get("QUERY_STRING", "")
        gc.collect()  # what is traced then is kept, not garbage in a cycle not yet collected
        snapshot = tracemalloc.take_snapshot().filter_traces(
            [tracemalloc.Filter(False, tracemalloc.__file__)])
        if "baseline=1" in query or self.baseline is None:
            self.baseline = snapshot
        stats = snapshot.compare_to(self.baseline, "traceback")[:15]
        current, peak = tracemalloc.get_traced_memory()
        body = {"pid": os.getpid(), "traced_mib": round(current / 2**20, 2),
                "peak_mib": round(peak / 2**20, 2),
                "grew": [{"kib": round(s.size_diff / 1024, 1), "count": s.count_diff,
                          "where": [f"{f.filename}:{f.lineno}" for f in s.traceback][-6:]}
                         for s in stats if s.size_diff > 0]}
        if "referrers=" in query:  # who keeps the live instances of one type
            body["referrers"] = _referrers(query.split("referrers=", 1)[1].split("&")[0])
        return Response(json.dumps(body), mimetype="application/json")(environ, start_response)


def _referrers(type_name: str) -> dict[str, Any]:
    from collections import Counter

    live = [o for o in gc.get_objects() if type(o).__name__ == type_name]
    held = Counter(type(r).__name__ for o in live[:200] for r in gc.get_referrers(o)
                   if r is not live)
    return {"live": len(live), "held_by": dict(held.most_common(10))}


def create_app() -> DispatcherMiddleware:
    mounts = {f"/{name}": functions_framework.create_app(target=name, source=str(MAIN),
                                                          signature_type="cloudevent")
              for name in ROUTES}
    mounts.update({f"/{name}": functions_framework.create_app(target=name, source=str(MAIN),
                                                               signature_type="http")
                   for name in HTTP_FUNCTIONS})
    bootstrap.warm()  # each worker (an instance) before it serves: no cold first delivery
    frames = int(os.environ.get("STASIS_HOST_TRACEMALLOC") or 0)
    if frames:
        tracemalloc.start(frames)
        mounts["/_memory"] = _Memory()
    return DispatcherMiddleware(_health, mounts)


app = create_app()
