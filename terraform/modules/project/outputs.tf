output "project_number" {
  description = "The project's number (service agents and Workload Identity principals use it)."
  value       = local.number
}

output "agents" {
  description = "Service agent e-mail addresses, by service."
  value = {
    artifactregistry = "service-${local.number}@gcp-sa-artifactregistry.iam.gserviceaccount.com"
    compute          = "service-${local.number}@compute-system.iam.gserviceaccount.com"
    container        = "service-${local.number}@container-engine-robot.iam.gserviceaccount.com"
    iap              = "service-${local.number}@gcp-sa-iap.iam.gserviceaccount.com"
    pubsub           = "service-${local.number}@gcp-sa-pubsub.iam.gserviceaccount.com"
    secretmanager    = "service-${local.number}@gcp-sa-secretmanager.iam.gserviceaccount.com"
    storage          = data.google_storage_project_service_account.gcs.email_address
  }
  depends_on = [google_project_service_identity.agents]
}

output "services" {
  description = "The enabled services (depend on this to wait for them)."
  value       = [for s in google_project_service.this : s.service]
}
