"""Monitoring triggers on the local stack: the Alertmanager webhook's token, and replaying a
saved notification onto the monitoring topic (`stasis events monitoring FILE.json`).

A replayed message takes the path a deployed one takes: the monitoring topic (the ``Raw``
route of ``functions/routes.py``), its push subscription, the ``on_monitoring`` function,
its dead-letter topic (`stasis dlq`).
The local token below is for loopback only and is not a secret; set
``STASIS_ALERTMANAGER_TOKEN`` to use another.
"""

from __future__ import annotations

import copy
import os
import uuid
from collections.abc import Mapping
from datetime import datetime
from typing import Any

LOCAL_ALERTMANAGER_TOKEN = "stasis-local-alertmanager-token"


def alertmanager_token(environ: Mapping[str, str] = os.environ) -> str:
    return environ.get("STASIS_ALERTMANAGER_TOKEN") or LOCAL_ALERTMANAGER_TOKEN


def restamp(payload: Any, now: datetime) -> Any:
    """``payload`` as if it had just been sent: its times moved to ``now`` and its id made
    new, so that a saved example can be tried (unchanged, an old one is refused as stale,
    and one already handled changes nothing, as in a deployment)."""
    fresh = copy.deepcopy(payload)
    suffix = uuid.uuid4().hex[:8]
    if isinstance(fresh, dict) and isinstance(fresh.get("incident"), dict):
        incident = fresh["incident"]
        incident["started_at"] = int(now.timestamp())
        incident["incident_id"] = f"{incident.get('incident_id', 'replay')}-{suffix}"
    elif isinstance(fresh, dict) and isinstance(fresh.get("alerts"), list):
        for alert in fresh["alerts"]:
            if isinstance(alert, dict):
                alert["startsAt"] = now.isoformat()
                alert["endsAt"] = "0001-01-01T00:00:00Z"
                alert["fingerprint"] = f"{alert.get('fingerprint', 'replay')}-{suffix}"
    elif isinstance(fresh, dict):
        fresh["timestamp"] = fresh["receiveTimestamp"] = now.isoformat()
        fresh["insertId"] = f"{fresh.get('insertId', 'replay')}-{suffix}"
    return fresh
