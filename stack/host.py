"""The function host of the local stack: every function of functions/main.py in ONE process.

Each function gets its own functions-framework app (exactly what it gets when deployed),
mounted at ``/<function name>``; a push subscription per function posts to that path.
One process instead of one per function: on this 2-core machine one host starts in about
the time one function does and uses one interpreter's memory instead of N (see
bench/function_host.py for the numbers), and the functions stay isolated where it matters:
each has its own app, route and dead-letter topic.

Run: ``gunicorn -k gthread --workers 2 --threads 8 -b 127.0.0.1:PORT stack.host:app``
(``stack.local.host_spec``; the workers are separate instances that share only the
emulators).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import functions_framework
from werkzeug.middleware.dispatcher import DispatcherMiddleware
from werkzeug.wrappers import Response

from functions.routes import HTTP_FUNCTIONS, ROUTES

MAIN = Path(__file__).resolve().parent.parent / "functions" / "main.py"


def _health(environ: dict[str, Any], start_response: Any) -> Any:
    return Response("ok\n", mimetype="text/plain")(environ, start_response)


def create_app() -> DispatcherMiddleware:
    mounts = {f"/{name}": functions_framework.create_app(target=name, source=str(MAIN),
                                                          signature_type="cloudevent")
              for name in ROUTES}
    mounts.update({f"/{name}": functions_framework.create_app(target=name, source=str(MAIN),
                                                               signature_type="http")
                   for name in HTTP_FUNCTIONS})
    return DispatcherMiddleware(_health, mounts)


app = create_app()
