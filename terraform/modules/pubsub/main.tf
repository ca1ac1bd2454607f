# One topic per event type; per event-triggered function a push subscription with
# exponential retry and a dead-letter topic (+ a pull subscription that `stasis dlq` reads).
# The same topology the local stack builds in stack/topology.py, from the same names. A
# function without an event (a Raw route of functions/routes.py: monitoring) takes the raw
# messages of its own topic (raw_topics), always through a push subscription; who publishes
# there is its module's business (modules/monitoring).
#
# Why push subscriptions of our own rather than the ones Eventarc creates: an Eventarc
# trigger's subscription cannot be given a dead-letter policy or message ordering from
# Terraform (hashicorp/terraform-provider-google#17697, #25069), and admissions rely on
# ordering (one team's requests one at a time). The functions framework turns the push into
# the same CloudEvent Eventarc would deliver. trigger_mode = "eventarc" is kept as an
# option; there the dead-letter policy is attached by modules/functions after creation.

resource "google_pubsub_topic" "events" {
  for_each = var.event_topics

  project      = var.project_id
  name         = each.value
  kms_key_name = var.kms_key
  labels       = merge(var.labels, { event = replace(each.key, ".", "_") })

  message_storage_policy {
    allowed_persistence_regions = var.message_regions
  }
}

resource "google_pubsub_topic" "raw" {
  for_each = toset(var.raw_topics)

  project      = var.project_id
  name         = each.value
  kms_key_name = var.kms_key
  labels       = merge(var.labels, { source = "external" })

  message_storage_policy {
    allowed_persistence_regions = var.message_regions
  }
}

resource "google_pubsub_topic" "dead_letters" {
  for_each = var.event_functions

  project      = var.project_id
  name         = each.value.dead_letter_topic
  kms_key_name = var.kms_key
  labels       = merge(var.labels, { consumer = each.key })

  message_storage_policy {
    allowed_persistence_regions = var.message_regions
  }
}

resource "google_pubsub_subscription" "dead_letters" {
  for_each = var.event_functions

  project                    = var.project_id
  name                       = each.value.dead_letter_subscription
  topic                      = google_pubsub_topic.dead_letters[each.key].id
  ack_deadline_seconds       = 60
  message_retention_duration = var.message_retention
  labels                     = merge(var.labels, { consumer = each.key })

  expiration_policy {
    ttl = ""
  }
}

resource "google_pubsub_subscription" "push" {
  for_each = { for n, f in var.event_functions : n => f if var.trigger_mode == "push" || f.event == null }

  project                    = var.project_id
  name                       = each.value.subscription
  topic                      = each.value.event == null ? google_pubsub_topic.raw[each.value.topic].id : google_pubsub_topic.events[each.value.event].id
  ack_deadline_seconds       = var.ack_deadline_seconds
  message_retention_duration = var.message_retention
  enable_message_ordering    = each.value.ordered
  labels                     = merge(var.labels, { consumer = each.key })

  push_config {
    push_endpoint = var.push_endpoints[each.key]
    oidc_token {
      service_account_email = var.push_service_account
      audience              = var.push_endpoints[each.key]
    }
  }

  retry_policy {
    minimum_backoff = var.minimum_backoff
    maximum_backoff = var.maximum_backoff
  }

  dead_letter_policy {
    dead_letter_topic     = google_pubsub_topic.dead_letters[each.key].id
    max_delivery_attempts = var.max_delivery_attempts
  }

  expiration_policy {
    ttl = ""
  }
}

# --- who may do what ---------------------------------------------------------------------------
# Each event topic: exactly the components that emit that event (authoritative binding).
resource "google_pubsub_topic_iam_binding" "publishers" {
  for_each = { for event, topic in google_pubsub_topic.events : event => topic if length(lookup(var.publishers, event, [])) > 0 }

  project = var.project_id
  topic   = each.value.name
  role    = "roles/pubsub.publisher"
  members = sort(distinct(var.publishers[each.key]))
}

resource "google_pubsub_topic_iam_binding" "dead_letter_publishers" {
  for_each = google_pubsub_topic.dead_letters

  project = var.project_id
  topic   = each.value.name
  role    = "roles/pubsub.publisher"
  # The function's own guard, and Pub/Sub forwarding after max_delivery_attempts.
  members = sort(distinct(compact([
    lookup(var.dead_letter_publishers, each.key, ""),
    "serviceAccount:${var.pubsub_agent}",
  ])))
}

resource "google_pubsub_subscription_iam_member" "push_agent" {
  for_each = google_pubsub_subscription.push

  project      = var.project_id
  subscription = each.value.name
  role         = "roles/pubsub.subscriber"
  member       = "serviceAccount:${var.pubsub_agent}"
}

resource "google_pubsub_subscription_iam_binding" "dead_letter_readers" {
  for_each = length(var.dead_letter_readers) > 0 ? google_pubsub_subscription.dead_letters : {}

  project      = var.project_id
  subscription = each.value.name
  role         = "roles/pubsub.subscriber"
  members      = sort(var.dead_letter_readers)
}

# Pub/Sub mints the push OIDC tokens as the push service account.
resource "google_service_account_iam_member" "push_token_creator" {
  service_account_id = "projects/${var.project_id}/serviceAccounts/${var.push_service_account}"
  role               = "roles/iam.serviceAccountTokenCreator"
  member             = "serviceAccount:${var.pubsub_agent}"
}
