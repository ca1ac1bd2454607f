variable "project_id" {
  type        = string
  description = "Project of the database."
}

variable "location" {
  type        = string
  description = "Firestore location: a multi-region (nam5, eur3) or a region. Cannot be changed after creation."
}

variable "point_in_time_recovery" {
  type        = bool
  description = "Keep 7 days of versions for point-in-time recovery (billed as storage)."
  default     = true
}

variable "delete_protection" {
  type        = bool
  description = "Refuse deleting the database (also outside Terraform)."
  default     = true
}

variable "kms_key" {
  type        = string
  description = "CMEK key for the database (in the database's location), or null for Google-managed encryption."
  default     = null
}

variable "services_ready" {
  type        = list(string)
  description = "The enabled APIs (the database waits for them)."
  default     = []
}
