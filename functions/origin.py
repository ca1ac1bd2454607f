"""Which component is at work now: the ``origin`` every event it publishes carries.

One process may serve every function (the local stack's function host), a deployed
instance only its own; either way ``bootstrap`` starts each delivery and each request with
:func:`enter` of its function's name, and the functions' bus stamps :func:`current` on
every event it publishes (``functions.domain.publishers`` says who may send what). A
context variable, not a global: concurrent requests in one process (one thread each) each
keep their own.

Why ``enter`` is not undone when the handler returns: a streamed response's body (the link
proxy's resume-and-run, for one) runs after the handler has returned, on the same thread,
and what it publishes is still that function's. The next request on the thread enters its
own function first. :func:`serving` is the scoped form, for tests.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from contextvars import ContextVar

_CURRENT: ContextVar[str] = ContextVar("stasis_origin", default="")


@contextmanager
def serving(component: str) -> Iterator[None]:
    """Run the block as ``component`` (a function of ``functions/routes.py``)."""
    token = _CURRENT.set(component)
    try:
        yield
    finally:
        _CURRENT.reset(token)


def enter(component: str) -> None:
    """From now on, in this thread's context, act as ``component``."""
    _CURRENT.set(component)


def current() -> str:
    """The component at work in this context ("" outside any)."""
    return _CURRENT.get()
