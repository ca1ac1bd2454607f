variable "project_id" {
  type        = string
  description = "The Google Cloud project to deploy into."
}

variable "region" {
  type        = string
  description = "Region of everything regional (functions, cluster, snapshot bucket, keys)."
  default     = "us-central1"
}

variable "firestore_location" {
  type        = string
  description = "Firestore location (nam5, eur3 or a region); fixed once created."
  default     = "nam5"
}

variable "iap_domain" {
  type        = string
  description = "Domain of the IAP hostnames: dashboard.<domain>, proxy.<domain>, links.<domain>."
}

variable "iap_members" {
  type        = list(string)
  description = "Who may pass IAP (user:, group:, domain:)."
}

variable "platform_admins" {
  type        = list(string)
  description = "E-mails of the dashboard's admins."
  default     = []
}

variable "agent_image" {
  type        = string
  description = "Image of the cluster monitor and the workspaces' snapshot agent."
}

variable "operators" {
  type        = list(string)
  description = "Members who may publish events and read dead letters with the stasis CLI."
  default     = []
}

variable "manage_kubernetes" {
  type        = bool
  description = "Apply the in-cluster objects; false for the very first apply (the cluster does not exist yet)."
  default     = true
}
