variable "project_id" {
  type        = string
  description = "Project of the key ring."
}

variable "location" {
  type        = string
  description = "Location of the key ring: a region (us-central1) or a multi-region (us); a CMEK key must be in the location of what it encrypts."
}

variable "key_ring" {
  type        = string
  description = "Name of the key ring (key rings cannot be deleted: pick a new name rather than reuse one)."
}

variable "keys" {
  type = map(object({
    users = list(string)
  }))
  description = "Keys to create, by name, each with the members (service agents) allowed to encrypt and decrypt with it."
}

variable "rotation_period" {
  type        = string
  description = "How often each key gets a new primary version, in seconds with an 's' suffix (at most 90 days)."
  default     = "7776000s"
  validation {
    condition     = can(regex("^[0-9]+s$", var.rotation_period)) && tonumber(trimsuffix(var.rotation_period, "s")) <= 7776000
    error_message = "rotation_period is seconds with an 's' suffix, at most 7776000s (90 days)."
  }
}

variable "labels" {
  type        = map(string)
  description = "Labels on every key."
  default     = {}
}
