output "function_urls" {
  description = "Function name -> its Cloud Run URL (private except the Slack function; IAP ones through iap_urls)."
  value       = module.functions.uris
}

output "slack_request_url" {
  description = "Paste into the Slack app's slash command and interactivity settings."
  value       = { for n in local.public_functions : n => module.functions.uris[n] }
}

output "iap_urls" {
  description = "The dashboard, the access proxy and the links API, behind IAP."
  value       = module.iap.urls
}

output "iap_ip_address" {
  description = "A record of every IAP hostname."
  value       = module.iap.ip_address
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
