"""What `stasis down` does about agent sandboxes: stop the running ones and wait for them.

A sandbox outlives an agent restart on purpose (its monitor runs in a session of its own),
but `stasis down` stops the whole stack: left alone, a monitor would run on with no
emulators to upload to. Each running sandbox is cancelled (it still collects its patch and
writes its result, which the next `stasis up` reports), and `down` waits a bounded time.
"""

from __future__ import annotations

import time

import requests

from stack.settings import Settings


def stop_running(settings: Settings, *, timeout: float = 30.0) -> list[str]:
    """Cancel every running sandbox of the node agent; the ids cancelled."""
    base = f"{settings.node_agent_url}/sandboxes"
    session = requests.Session()
    session.trust_env = False
    session.headers.update(settings.node_agent_headers())
    try:
        listing = session.get(base, timeout=10).json().get("sandboxes", [])
    except (requests.RequestException, ValueError, AttributeError):
        return []  # no agent, or an agent without sandboxes: nothing runs
    running = [s["sandbox_id"] for s in listing if s.get("state") == "running"]
    for sandbox_id in running:
        try:
            session.delete(f"{base}/{sandbox_id}", timeout=10)
        except requests.RequestException:
            continue
    deadline = time.monotonic() + timeout
    while running and time.monotonic() < deadline:
        try:
            states = {s["sandbox_id"]: s.get("state")
                      for s in session.get(base, timeout=10).json().get("sandboxes", [])}
        except (requests.RequestException, ValueError):
            break
        if all(states.get(s) != "running" for s in running):
            break
        time.sleep(0.2)
    return running
