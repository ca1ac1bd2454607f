variable "project_id" {
  type        = string
  description = "Project of the secrets."
}

variable "secrets" {
  type = map(object({
    secret_id   = string
    description = string
    accessors   = list(string)
  }))
  description = "Environment variable -> the Secret Manager secret that fills it, and the members that may read it."
}

variable "values" {
  type        = map(string)
  description = "Optional initial values by environment variable. Leave empty to add versions out of band (`gcloud secrets versions add`), which keeps them out of the Terraform state."
  default     = {}
  sensitive   = true
}

variable "region" {
  type        = string
  description = "The only region where the secrets are stored (user-managed replication)."
}

variable "kms_key" {
  type        = string
  description = "CMEK key for the secrets (in var.region)."
}

variable "labels" {
  type        = map(string)
  description = "Labels on every secret."
  default     = {}
}

variable "kms_ready" {
  type        = list(string)
  description = "Ids of the KMS grants to the Secret Manager agent (the secrets wait for them)."
  default     = []
}
