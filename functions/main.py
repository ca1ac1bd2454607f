"""Deployed entry points: one module-level function per function of ``functions/routes.py``.

functions-framework finds a target by name in this module (``functions-framework --target
NAME --source functions/main.py`` locally; on Cloud Functions the bundle's root ``main.py``
re-exports these), and its decorators record each one's signature type under its
``__name__`` (``_function_registry.REGISTRY_MAP``). So each entry point is made from the
table: a function named after the route, decorated as a CloudEvent or an HTTP function,
whose one line hands over to ``bootstrap``.

Nothing is built at import time (cold start): ``bootstrap`` builds the adapters on the
first call.
"""

from collections.abc import Callable
from typing import Any

import functions_framework

from functions import bootstrap
from functions.routes import HTTP_FUNCTIONS, ROUTES


def _event_function(name: str) -> Callable[[Any], None]:
    def entry(cloud_event: Any) -> None:
        bootstrap.deliver(name, cloud_event)

    entry.__name__ = entry.__qualname__ = name
    return functions_framework.cloud_event(entry)


def _http_function(name: str) -> Callable[[Any], Any]:
    def entry(request: Any) -> Any:
        return bootstrap.serve(name, request)

    entry.__name__ = entry.__qualname__ = name
    return functions_framework.http(entry)


globals().update({name: _event_function(name) for name in ROUTES})
globals().update({name: _http_function(name) for name in HTTP_FUNCTIONS})
__all__ = sorted([*ROUTES, *HTTP_FUNCTIONS])
