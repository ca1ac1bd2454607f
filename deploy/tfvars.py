"""Terraform's generated inputs (``stasis.auto.tfvars.json``), derived from the code's tables.

Terraform never lists functions, topics or indexes by hand: every function of
``functions/routes.py`` (an event function with its topic, push and dead-letter
subscriptions, dead-letter topic and ordering; an HTTP function with its exposure and, for
a scheduler-only one, its cron), the topics of ``events.CATALOG``, ``MAX_DELIVERY_ATTEMPTS``,
the composite indexes the stores declare (``deploy/indexes.py``), the cluster objects
(``deploy/cluster.py``), the monitoring triggers' settings (:func:`monitoring`) and, per
event, the components that may publish it (``functions.routes.PUBLISHERS``: Terraform grants
``roles/pubsub.publisher`` on each topic to exactly their identities). Each
function also gets its Cloud Run name and its own service account id. A new function is
deployed by the next ``stasis bundle && terraform apply``, with no edit under terraform/.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from deploy import cluster, indexes

ROOT = Path(__file__).resolve().parent.parent
TFVARS_NAME = "stasis.auto.tfvars.json"
ENVIRONMENTS = ROOT / "terraform" / "environments"
DEFAULT_CONFIG = ROOT / "examples" / "stasis.yaml"


@dataclass(frozen=True)
class Deployment:
    """What Terraform deploys, as its variables say it (less the source archive)."""

    event_functions: dict[str, dict[str, Any]]
    http_functions: dict[str, dict[str, Any]]
    topics: dict[str, str]  # event name -> topic
    max_delivery_attempts: int
    firestore_indexes: list[dict[str, Any]]
    kubernetes: dict[str, Any]
    monitoring: dict[str, Any] = field(default_factory=dict)
    publishers: dict[str, list[str]] = field(default_factory=dict)  # event -> components
    warnings: list[str] = field(default_factory=list)

    def tfvars(self, source_archive: str, source_sha256: str) -> dict[str, Any]:
        return {
            "source_archive": source_archive,
            "source_sha256": source_sha256,
            "event_topics": dict(sorted(self.topics.items())),
            "max_delivery_attempts": self.max_delivery_attempts,
            "event_functions": dict(sorted(self.event_functions.items())),
            "http_functions": dict(sorted(self.http_functions.items())),
            "kubernetes": self.kubernetes,
            "firestore_indexes": self.firestore_indexes,
            "monitoring": self.monitoring,
            "event_publishers": self.publishers,
        }


def deployment(config: Path = DEFAULT_CONFIG,
               table: Mapping[str, Any] | None = None) -> Deployment:
    """The functions of ``table`` (default: ``functions.routes.FUNCTIONS``), topics, delivery
    settings, indexes and cluster objects Terraform deploys (teams and storage classes from
    the admin ``config``)."""
    from events import CATALOG
    from functions.delivery import MAX_DELIVERY_ATTEMPTS
    from functions.domain.publishers import publishers
    from functions.routes import FUNCTIONS, Exposure, Http, Raw, Route

    event_functions: dict[str, dict[str, Any]] = {}
    http_functions: dict[str, dict[str, Any]] = {}
    warnings: list[str] = []
    table = FUNCTIONS if table is None else table
    senders = publishers({name: entry.emits for name, entry in table.items()})
    for name, entry in table.items():
        common = {"deploy_name": deploy_name(name), "account_id": account_id(name)}
        if isinstance(entry, Route | Raw):  # a Raw one: event None, its own topic
            event_functions[name] = {
                "kind": "cloudevent", "access": "event", **common,
                "event": entry.event, "topic": entry.topic,
                "dead_letter_topic": entry.dead_letter_topic,
                "subscription": entry.subscription,
                "dead_letter_subscription": entry.dead_letter_subscription,
                "ordered": entry.ordered,
            }
        elif isinstance(entry, Http):
            http_functions[name] = {"kind": "http", "access": str(entry.exposure), **common}
            if entry.schedule is not None:
                http_functions[name]["schedule"] = entry.schedule
            elif entry.exposure is Exposure.SCHEDULER:
                warnings.append(f"{name}: scheduler-only HTTP function without a schedule (set "
                                "one with the Terraform variable schedule_overrides)")
        else:
            raise TypeError(f"{name}: neither a Route nor an Http function: {entry!r}")
    declared = [q for queries in indexes.declared().values() for q in queries]
    return Deployment(
        event_functions,
        http_functions,
        {name: spec.topic for name, spec in CATALOG.items()},
        MAX_DELIVERY_ATTEMPTS,
        indexes.composite_indexes(declared),
        cluster.kubernetes_objects(*cluster.teams_and_classes(config),
                                   catalog=cluster.admin_catalog(config)),
        monitoring(config),
        {event: sorted(senders.get(event, ())) for event in sorted(CATALOG)},
        warnings,
    )


def monitoring(config: Path) -> dict[str, Any]:
    """The monitoring topic and the GPU-idle alert (terraform/modules/monitoring): under the
    idle policy's own GPU threshold (``functions.domain.idle.GPU_BUSY_PERCENT``) for the
    shortest idle time after which a GPU profile of ``config`` pauses (None: no GPU
    profile, no policy). The alert is the prompt; each profile's own rules decide."""
    import yaml

    from functions.domain.idle import GPU_BUSY_PERCENT
    from functions.handlers.monitoring import TOPIC

    data = yaml.safe_load(config.read_text()) or {}
    windows = [int(rule["idle_seconds"]) for profile in data.get("profiles") or []
               if str((profile.get("accelerator") or {}).get("type", "")).startswith("nvidia")
               for rule in (profile.get("idle_policy") or {}).get("rules") or []
               if rule.get("effect") == "pause"]
    return {"topic": TOPIC, "gpu_idle_percent": GPU_BUSY_PERCENT,
            "gpu_idle_window_seconds": min(windows) if windows else None}


def deploy_name(function: str) -> str:
    """``on_workspace_ready`` -> ``stasis-on-workspace-ready`` (Cloud Run: [a-z0-9-], <= 49)."""
    return _slug("stasis-" + function, 49)


def account_id(function: str) -> str:
    """A service account id (6-30 of [a-z0-9-], starting with a letter), unique per function:
    too long a name is cut and given a short hash so that two never collide."""
    return _slug("sx-" + function, 30)


def _slug(text: str, limit: int) -> str:
    slug = re.sub(r"[^a-z0-9]+", "-", text.lower()).strip("-")
    if len(slug) <= limit:
        return slug
    digest = hashlib.sha256(text.encode()).hexdigest()[:6]
    return slug[: limit - 7].rstrip("-") + "-" + digest


def write(path: Path, plan: Deployment, archive: Path, sha256: str) -> None:
    """The generated variables, with the archive path relative to the file's directory
    (Terraform runs in that directory)."""
    rel = os.path.relpath(archive.resolve(), path.resolve().parent)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(plan.tfvars(rel, sha256), indent=2) + "\n")
