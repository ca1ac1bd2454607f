# Cloud Scheduler: the periodic functions, called with an OIDC token of one dedicated
# service account that may invoke them and nothing else.

resource "google_cloud_scheduler_job" "this" {
  for_each = var.jobs

  project          = var.project_id
  region           = var.region
  name             = "stasis-${replace(each.key, "_", "-")}"
  description      = "Stasis ${each.key}"
  schedule         = each.value.schedule
  time_zone        = var.time_zone
  attempt_deadline = var.attempt_deadline
  paused           = var.paused

  retry_config {
    retry_count          = 1
    min_backoff_duration = "30s"
    max_backoff_duration = "300s"
  }

  http_target {
    http_method = "POST"
    uri         = each.value.uri
    headers     = { "Content-Type" = "application/json" }
    body        = base64encode("{}")
    oidc_token {
      service_account_email = var.service_account
      audience              = each.value.uri
    }
  }
}
