output "slack_request_url" {
  description = "Request URL of the Slack app's slash command."
  value       = module.stasis.slack_request_url
}

output "alertmanager_webhook_url" {
  description = "URL for Alertmanager's webhook_configs (bearer token: the stasis-alertmanager-token secret)."
  value       = module.stasis.alertmanager_webhook_url
}

output "iap_urls" {
  description = "Dashboard, access proxy and links API (behind IAP)."
  value       = module.stasis.iap_urls
}

output "ide_url" {
  description = "The IDE access proxy: every workspace's IDE at <it>/w/<workspace id>/ (behind IAP)."
  value       = module.stasis.ide_url
}

output "ide_ip_address" {
  description = "Point the IDE proxy's hostname (ide.<iap_domain>) here."
  value       = module.stasis.ide_ip_address
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
