variable "project_id" {
  type        = string
  description = "Project of the buckets."
}

variable "name_prefix" {
  type        = string
  description = "Bucket names are <name_prefix>-snapshots, -functions-source and -access-logs (bucket names are global: include the project id)."
}

variable "snapshot_location" {
  type        = string
  description = "Location of the snapshot bucket. GKE Pod Snapshots need it in the cluster's region."
}

variable "source_location" {
  type        = string
  description = "Location of the function-source and access-log buckets (the functions' region)."
}

variable "snapshot_kms_key" {
  type        = string
  description = "CMEK key for the snapshot bucket (same location as the bucket)."
}

variable "source_kms_key" {
  type        = string
  description = "CMEK key for the function-source and access-log buckets (same location as they are)."
}

variable "snapshot_backstop_days" {
  type        = number
  description = "Objects older than this are deleted by the bucket itself: the backstop behind the janitor, which applies each profile's and team's retention. Keep it above the longest retention in the catalog."
  default     = 45
  validation {
    condition     = var.snapshot_backstop_days >= 1
    error_message = "snapshot_backstop_days must be at least 1."
  }
}

variable "snapshot_soft_delete_seconds" {
  type        = number
  description = "Soft-delete retention of deleted snapshot objects, in seconds (0 disables it, the default: snapshots are large and churn, Pod Snapshots' parallel composite uploads delete temporary parts, and soft-deleted bytes are billed; the bucket's own lifecycle and the janitor decide what is kept). 604800 (7 days) is Google's default."
  default     = 0
  validation {
    condition     = var.snapshot_soft_delete_seconds == 0 || (var.snapshot_soft_delete_seconds >= 604800 && var.snapshot_soft_delete_seconds <= 7776000)
    error_message = "snapshot_soft_delete_seconds is 0 or 604800-7776000 (7-90 days)."
  }
}

variable "hierarchical_namespace" {
  type        = bool
  description = "Hierarchical namespace on the snapshot bucket (GKE Pod Snapshots require it for their request rate; it also rules out object versioning)."
  default     = true
}

variable "force_destroy" {
  type        = bool
  description = "Let `terraform destroy` delete non-empty buckets (dev only)."
  default     = false
}

variable "labels" {
  type        = map(string)
  description = "Labels on every bucket."
  default     = {}
}

variable "kms_ready" {
  type        = list(string)
  description = "Ids of the KMS grants to the Cloud Storage service agent (the buckets wait for them)."
  default     = []
}
