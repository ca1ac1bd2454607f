# Cloud Functions (2nd gen): one per entry point of functions/main.py, all built from the
# one bundle `stasis bundle` writes, each with its own service account. The roles of those
# accounts are granted where the resources are (modules/stasis: iam.tf), per function.

locals {
  settings = {
    for name, f in var.functions : name => merge(var.defaults, {
      for k, v in lookup(var.overrides, name, {}) : k => v if v != null
    })
  }
  ingress = {
    event     = "ALLOW_INTERNAL_ONLY" # Pub/Sub push / Eventarc from this project
    scheduler = "ALLOW_INTERNAL_ONLY" # Cloud Scheduler from this project
    iap       = "ALLOW_INTERNAL_AND_GCLB"
    public    = "ALLOW_ALL" # Slack, Alertmanager; the functions verify every request
  }
  # Those Eventarc triggers in eventarc mode; one without an event (a Raw route) is always
  # fed by its own push subscription (modules/pubsub).
  event_functions = { for name, f in var.functions : name => f if f.kind == "cloudevent" && f.event != null }
  invokers = merge([
    for name, members in var.invokers : {
      for member in members : "${name}/${member}" => { function = name, member = member }
    }
  ]...)
}

resource "terraform_data" "ready" {
  input = var.ready
}

resource "google_service_account" "function" {
  for_each = var.functions

  project      = var.project_id
  account_id   = each.value.account_id
  display_name = "Stasis function ${each.key}"
  description  = "Runs only the ${each.key} function (${each.value.access})."
}

# --- the build -------------------------------------------------------------------------------
resource "google_service_account" "build" {
  project      = var.project_id
  account_id   = "stasis-functions-build"
  display_name = "Stasis functions build"
  description  = "Cloud Build identity for the Stasis functions: reads the bundle, pushes the images."
}

resource "google_project_iam_member" "build_logs" {
  project = var.project_id
  role    = "roles/logging.logWriter"
  member  = google_service_account.build.member
}

resource "google_artifact_registry_repository" "functions" {
  project       = var.project_id
  location      = var.region
  repository_id = "stasis-functions"
  description   = "Images of the Stasis functions (built by Cloud Functions)."
  format        = "DOCKER"
  kms_key_name  = var.artifact_kms_key
  labels        = var.labels

  cleanup_policy_dry_run = false
  cleanup_policies {
    id     = "keep-recent"
    action = "KEEP"
    most_recent_versions {
      keep_count = 10
    }
  }
  cleanup_policies {
    id     = "delete-old"
    action = "DELETE"
    condition {
      older_than = "2592000s"
    }
  }
  depends_on = [terraform_data.ready]
}

resource "google_artifact_registry_repository_iam_member" "build" {
  project    = var.project_id
  location   = google_artifact_registry_repository.functions.location
  repository = google_artifact_registry_repository.functions.name
  role       = "roles/artifactregistry.writer"
  member     = google_service_account.build.member
}

resource "google_storage_bucket_iam_member" "build_source" {
  bucket = var.source_bucket
  role   = "roles/storage.objectViewer"
  member = google_service_account.build.member
}

resource "google_storage_bucket_object" "source" {
  name   = "stasis-functions-${substr(var.source_sha256, 0, 16)}.zip"
  bucket = var.source_bucket
  source = var.source_archive
}

# --- the functions ---------------------------------------------------------------------------
resource "google_cloudfunctions2_function" "this" {
  #checkov:skip=CKV_GCP_124:Ingress is per access class (local.ingress): internal for event and scheduled functions, internal+load balancer for IAP ones; only the public ones are ALLOW_ALL: Slack's, which verifies every request's Slack signature, and Alertmanager's, which requires its bearer token (constant-time compare, refusing all without one).
  for_each = var.functions

  project     = var.project_id
  name        = each.value.deploy_name
  location    = var.region
  description = "Stasis ${each.key} (${each.value.kind}, ${each.value.access})"
  labels      = merge(var.labels, { stasis-function = replace(each.key, "_", "-"), access = each.value.access })

  build_config {
    runtime           = var.runtime
    entry_point       = each.key
    service_account   = google_service_account.build.id
    docker_repository = google_artifact_registry_repository.functions.id
    source {
      storage_source {
        bucket = var.source_bucket
        object = google_storage_bucket_object.source.name
      }
    }
  }

  service_config {
    available_memory                 = local.settings[each.key].memory
    available_cpu                    = local.settings[each.key].cpu
    timeout_seconds                  = local.settings[each.key].timeout
    max_instance_count               = local.settings[each.key].max_instances
    min_instance_count               = lookup(var.min_instances, each.key, 0)
    max_instance_request_concurrency = local.settings[each.key].concurrency
    service_account_email            = google_service_account.function[each.key].email
    ingress_settings                 = local.ingress[each.value.access]
    all_traffic_on_latest_revision   = true

    environment_variables = merge(var.environment, lookup(var.function_environment, each.key, {}), {
      STASIS_FUNCTION  = each.key
      LOG_EXECUTION_ID = "true"
    })

    dynamic "secret_environment_variables" {
      for_each = { for env, s in var.secret_environment : env => s if contains(s.functions, each.key) }
      content {
        key        = secret_environment_variables.key
        project_id = var.project_id
        secret     = secret_environment_variables.value.secret_id
        version    = "latest"
      }
    }

    direct_vpc_egress = contains(var.vpc_functions, each.key) ? "VPC_EGRESS_PRIVATE_RANGES_ONLY" : null
    dynamic "direct_vpc_network_interface" {
      for_each = contains(var.vpc_functions, each.key) ? [var.vpc] : []
      content {
        network    = direct_vpc_network_interface.value.network
        subnetwork = direct_vpc_network_interface.value.subnetwork
        tags       = ["stasis-functions"]
      }
    }
  }

  dynamic "event_trigger" {
    for_each = var.trigger_mode == "eventarc" && contains(keys(local.event_functions), each.key) ? [each.value] : []
    content {
      trigger_region        = var.region
      event_type            = "google.cloud.pubsub.topic.v1.messagePublished"
      pubsub_topic          = var.topic_ids[event_trigger.value.event]
      retry_policy          = "RETRY_POLICY_RETRY"
      service_account_email = var.trigger_service_account
    }
  }

  depends_on = [
    terraform_data.ready,
    google_artifact_registry_repository_iam_member.build,
    google_storage_bucket_iam_member.build_source,
    google_project_iam_member.build_logs,
  ]
}

resource "google_cloud_run_v2_service_iam_member" "invokers" {
  #checkov:skip=CKV_GCP_102:Only the public functions are invokable by allUsers: Slack and a cluster's Alertmanager cannot authenticate to Google; the chat function rejects every request without a valid Slack signature (5-minute window), the alertmanager one every request without its bearer token.
  for_each = local.invokers

  project  = var.project_id
  location = var.region
  name     = google_cloudfunctions2_function.this[each.value.function].name
  role     = "roles/run.invoker"
  member   = each.value.member
}

# Eventarc mode only: Terraform cannot configure the subscription Eventarc creates, so the
# dead-letter policy, the retry bounds and the Pub/Sub agent's right to forward are set on
# it with gcloud after each (re)creation of the trigger (needs gcloud where Terraform runs).
resource "terraform_data" "eventarc_dead_letters" {
  for_each = var.trigger_mode == "eventarc" ? local.event_functions : {}

  triggers_replace = [
    google_cloudfunctions2_function.this[each.key].event_trigger[0].trigger,
    var.dead_letter_topic_ids[each.key],
    var.max_delivery_attempts,
  ]

  provisioner "local-exec" {
    interpreter = ["bash", "-c"]
    command     = <<-EOT
      set -euo pipefail
      sub=$(gcloud eventarc triggers describe "$TRIGGER" --project "$PROJECT" \
        --location "$REGION" --format 'value(transport.pubsub.subscription)')
      gcloud pubsub subscriptions update "$sub" --project "$PROJECT" \
        --dead-letter-topic "$DEAD_LETTER_TOPIC" --max-delivery-attempts "$ATTEMPTS" \
        --min-retry-delay 10s --max-retry-delay 600s
      gcloud pubsub subscriptions add-iam-policy-binding "$sub" --project "$PROJECT" \
        --member "serviceAccount:$PUBSUB_AGENT" --role roles/pubsub.subscriber >/dev/null
    EOT
    environment = {
      PROJECT           = var.project_id
      REGION            = var.region
      TRIGGER           = google_cloudfunctions2_function.this[each.key].event_trigger[0].trigger
      DEAD_LETTER_TOPIC = var.dead_letter_topic_ids[each.key]
      ATTEMPTS          = tostring(var.max_delivery_attempts)
      PUBSUB_AGENT      = var.pubsub_agent
    }
  }
}
