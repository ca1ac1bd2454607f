# The project's APIs and the Google-managed service agents the other modules grant roles to.
# Agents that only exist once asked for (IAP, Secret Manager, Pub/Sub, Artifact Registry)
# are created explicitly, so that the KMS and IAM grants below never race their creation.

resource "google_project_service" "this" {
  for_each = toset(var.services)

  project            = var.project_id
  service            = each.value
  disable_on_destroy = false
}

data "google_project" "this" {
  project_id = var.project_id
}

resource "google_project_service_identity" "agents" {
  provider = google-beta
  for_each = toset([
    "artifactregistry.googleapis.com",
    "iap.googleapis.com",
    "pubsub.googleapis.com",
    "secretmanager.googleapis.com",
  ])

  project    = var.project_id
  service    = each.value
  depends_on = [google_project_service.this]
}

data "google_storage_project_service_account" "gcs" {
  project    = var.project_id
  depends_on = [google_project_service.this]
}

locals {
  number = data.google_project.this.number
}
