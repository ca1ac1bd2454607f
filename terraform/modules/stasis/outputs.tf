output "function_urls" {
  description = "Function name -> its Cloud Run URL (private except the Slack function; IAP ones through iap_urls)."
  value       = module.functions.uris
}

output "slack_request_url" {
  description = "Paste into the Slack app's slash command and interactivity settings."
  value       = { for n in local.public_functions : n => module.functions.uris[n] if can(regex("slack|chat", n)) }
}

output "alertmanager_webhook_url" {
  description = "Alertmanager's webhook_configs url (with the bearer token of stasis-alertmanager-token)."
  value       = { for n in local.public_functions : n => module.functions.uris[n] if can(regex("alertmanager", n)) }
}

output "monitoring_notification_channel" {
  description = "The Pub/Sub notification channel of the Stasis alert policies (add it to your own)."
  value       = module.monitoring.notification_channel
}

output "iap_urls" {
  description = "The dashboard, the access proxy and the links API, behind IAP."
  value       = module.iap.urls
}

output "iap_ip_address" {
  description = "A record of every IAP hostname."
  value       = module.iap.ip_address
}

output "ide_url" {
  description = "The IDE access proxy (every workspace's IDE at <it>/w/<workspace id>/), behind IAP."
  value       = "https://${local.ide_hostname}"
}

output "ide_ip_address" {
  description = "A record of the IDE proxy's hostname."
  value       = google_compute_global_address.ide.address
}

output "snapshot_bucket" {
  description = "The snapshot bucket."
  value       = module.storage.snapshot_bucket
}

output "cluster" {
  description = "The GKE cluster (gcloud container clusters get-credentials --dns-endpoint)."
  value       = { id = module.gke.cluster_id, dns_endpoint = module.gke.dns_endpoint }
}

output "cluster_dns_endpoint" {
  description = "The control plane's DNS endpoint (the Kubernetes provider's host)."
  value       = module.gke.dns_endpoint
}

output "scheduler_jobs" {
  description = "Function name -> Cloud Scheduler job."
  value       = module.scheduler.jobs
}

output "secrets" {
  description = "Secrets to fill before the first deploy: gcloud secrets versions add <id> --data-file=-"
  value       = module.secrets.secret_ids
}
