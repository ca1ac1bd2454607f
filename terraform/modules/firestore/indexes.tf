# The composite indexes the code's queries need, and the TTL policies.
#
# tests/unit/test_terraform.py reads every query in the code (stack/firestore_indexes.py:
# client chains and the dashboard's PageQuery/Aggregation) and fails, naming the index to
# add here, when one is missing. Equality filters alone need no composite index; an
# equality field followed by the query's order and range fields does. One index per
# equality field (not per combination of filters) is enough: Firestore merges them.
# Field spelling: "name" ascending, "name:desc" descending, "name:contains" array-contains.

locals {
  composite_indexes = [
    # audit: the dashboard's log (newest first, filtered by any one of these), the cost
    # rollup (one team since the 1st), a workspace's history.
    { collection = "audit", fields = ["action", "time:desc"] },
    { collection = "audit", fields = ["actor", "time:desc"] },
    { collection = "audit", fields = ["target", "time:desc"] },
    { collection = "audit", fields = ["team", "time"] },
    { collection = "audit", fields = ["team", "time:desc"] },

    # links: the dashboard's link list by status (active/expired/revoked) and filters.
    { collection = "links", fields = ["creator", "created_at:desc"] },
    { collection = "links", fields = ["creator", "expires_at"] },
    { collection = "links", fields = ["creator", "expires_at:desc"] },
    { collection = "links", fields = ["creator", "revoked_at:desc"] },
    { collection = "links", fields = ["revoked_at", "expires_at"] },
    { collection = "links", fields = ["revoked_at", "expires_at:desc"] },
    { collection = "links", fields = ["team", "created_at:desc"] },
    { collection = "links", fields = ["team", "expires_at"] },
    { collection = "links", fields = ["team", "expires_at:desc"] },
    { collection = "links", fields = ["team", "revoked_at"] },
    { collection = "links", fields = ["team", "revoked_at:desc"] },
    { collection = "links", fields = ["workspace", "created_at:desc"] },
    { collection = "links", fields = ["workspace", "expires_at"] },
    { collection = "links", fields = ["workspace", "expires_at:desc"] },
    { collection = "links", fields = ["workspace", "revoked_at:desc"] },

    # sandboxes: newest request first, per team or state.
    { collection = "sandboxes", fields = ["state", "requested_at:desc"] },
    { collection = "sandboxes", fields = ["team", "requested_at:desc"] },

    # snapshots: expiring soon, oldest live, the janitor's orphans, per team.
    { collection = "snapshots", fields = ["expired_reason", "expired_at:desc"] },
    { collection = "snapshots", fields = ["status", "created_at"] },
    { collection = "snapshots", fields = ["status", "expires_at"] },
    { collection = "snapshots", fields = ["team", "created_at"] },
    { collection = "snapshots", fields = ["team", "expired_at:desc"] },
    { collection = "snapshots", fields = ["team", "expires_at"] },

    # workspaces: the fleet page (newest first under any filter), latency samples.
    { collection = "workspaces", fields = ["owner", "created_at:desc"] },
    { collection = "workspaces", fields = ["profile", "created_at:desc"] },
    { collection = "workspaces", fields = ["profile", "updated_at:desc"] },
    { collection = "workspaces", fields = ["state", "created_at:desc"] },
    { collection = "workspaces", fields = ["team", "created_at:desc"] },
    { collection = "workspaces", fields = ["team", "updated_at:desc"] },
  ]

  # Documents Firestore deletes once the field's time has passed (within about a day; the
  # janitor does not rely on it). index = false: the field is never queried, so its
  # single-field indexes (a write hotspot for monotonically increasing times) are dropped.
  ttl_fields = {
    "chat_notified.expire_at" = { collection = "chat_notified", field = "expire_at", index = false }
    "chat_requests.expire_at" = { collection = "chat_requests", field = "expire_at", index = false }
    "deliveries.expire_at"    = { collection = "deliveries", field = "expire_at", index = false }
    "links.purge_at"          = { collection = "links", field = "purge_at", index = false }
    "processed.expire_at"     = { collection = "processed", field = "expire_at", index = false }
    "snapshots.expires_at"    = { collection = "snapshots", field = "expires_at", index = true }
  }
}
