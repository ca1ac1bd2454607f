output "slack_request_url" {
  description = "Request URL of the Slack app's slash command."
  value       = module.stasis.slack_request_url
}

output "iap_urls" {
  description = "Dashboard, access proxy and links API (behind IAP)."
  value       = module.stasis.iap_urls
}

output "iap_ip_address" {
  description = "Point the IAP hostnames' A records here."
  value       = module.stasis.iap_ip_address
}

output "snapshot_bucket" {
  description = "The snapshot bucket."
  value       = module.stasis.snapshot_bucket
}

output "cluster" {
  description = "The GKE cluster."
  value       = module.stasis.cluster
}

output "secrets" {
  description = "Secrets to give a version before the functions start: gcloud secrets versions add ID --data-file=-"
  value       = module.stasis.secrets
}
