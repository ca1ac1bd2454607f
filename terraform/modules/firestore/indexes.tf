# The TTL policies. (The composite indexes are generated: var.composite_indexes, from the
# queries the code declares in functions/queries.py.)

locals {
  # Documents Firestore deletes once the field's time has passed (within about a day; the
  # janitor does not rely on it). index = false: the field is never queried, so its
  # single-field indexes (a write hotspot for monotonically increasing times) are dropped.
  ttl_fields = {
    "chat_notified.expire_at"  = { collection = "chat_notified", field = "expire_at", index = false }
    "chat_requests.expire_at"  = { collection = "chat_requests", field = "expire_at", index = false }
    "deliveries.expire_at"     = { collection = "deliveries", field = "expire_at", index = false }
    "links.purge_at"           = { collection = "links", field = "purge_at", index = false }
    "portal_signins.expire_at" = { collection = "portal_signins", field = "expire_at", index = false }
    "processed.expire_at"      = { collection = "processed", field = "expire_at", index = false }
    "snapshots.expires_at"     = { collection = "snapshots", field = "expires_at", index = true }
  }
}
