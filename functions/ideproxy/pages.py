"""The proxy's own pages: a paused workspace (with "Resume"), one on its way to RUNNING
(reloading itself), a refusal, and the sign-in hint. Server-rendered, no JavaScript, with
the dashboard's stylesheet so that the portal, the dashboard and these pages look alike."""

from __future__ import annotations

from functools import cache
from pathlib import Path
from typing import Any

from jinja2 import Environment, FileSystemLoader, StrictUndefined, select_autoescape

_HERE = Path(__file__).resolve().parent
_STYLESHEET = _HERE.parent / "dashboard" / "templates" / "dashboard.css"
_DEFAULTS: dict[str, Any] = {"state": None, "user": None, "resume_action": None,
                             "csrf": None, "link": None, "refresh": None, "refresh_to": None}


@cache
def _environment() -> Environment:
    return Environment(loader=FileSystemLoader(_HERE / "templates"),
                       autoescape=select_autoescape(["html"]), undefined=StrictUndefined)


@cache
def _stylesheet() -> str:
    return _STYLESHEET.read_text()


def render(*, status: int, title: str, message: str, **extra: Any) -> str:
    """The page: ``state``, ``user``, ``resume_action`` (+ ``csrf``), ``link``
    ({href, text}), ``refresh`` (seconds, + ``refresh_to``) are optional."""
    values = {**_DEFAULTS, **extra}
    return _environment().get_template("page.html").render(
        status=status, title=title, message=message, stylesheet=_stylesheet(), **values)
