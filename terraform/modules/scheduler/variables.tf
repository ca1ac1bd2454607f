variable "project_id" {
  type        = string
  description = "Project of the jobs."
}

variable "region" {
  type        = string
  description = "Region of the jobs."
}

variable "jobs" {
  type = map(object({
    schedule = string
    uri      = string
  }))
  description = "Function name -> its cron schedule and HTTPS endpoint (the private HTTP functions: janitor, reconcile, idle sweep, cost rollup)."
}

variable "service_account" {
  type        = string
  description = "E-mail of the identity the jobs call the functions as (OIDC)."
}

variable "time_zone" {
  type        = string
  description = "Time zone of the schedules."
  default     = "Etc/UTC"
}

variable "attempt_deadline" {
  type        = string
  description = "How long one call may take before Cloud Scheduler counts it failed."
  default     = "540s"
}

variable "paused" {
  type        = bool
  description = "Create the jobs paused (no sweeps, no janitor)."
  default     = false
}
