variable "project_id" {
  type        = string
  description = "The Google Cloud project Stasis is deployed into."
}

variable "services" {
  type        = list(string)
  description = "APIs to enable. The default is what every Stasis module uses."
  default = [
    "artifactregistry.googleapis.com",
    "cloudbuild.googleapis.com",
    "cloudfunctions.googleapis.com",
    "cloudkms.googleapis.com",
    "cloudscheduler.googleapis.com",
    "compute.googleapis.com",
    "container.googleapis.com",
    "eventarc.googleapis.com",
    "firestore.googleapis.com",
    "iam.googleapis.com",
    "iamcredentials.googleapis.com",
    "iap.googleapis.com",
    "logging.googleapis.com",
    "monitoring.googleapis.com",
    "pubsub.googleapis.com",
    "run.googleapis.com",
    "secretmanager.googleapis.com",
    "storage.googleapis.com",
    # Security Token Service: the cluster monitor's downscoped snapshot tokens.
    "sts.googleapis.com",
  ]
}
