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

variable "slack" {
  type = object({
    team_id       = string
    enterprise_id = optional(string, "")
  })
  description = "The Slack workspace (and Enterprise Grid org) the chat function serves."
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

variable "ide_iap_audience" {
  type        = string
  description = "The IDE proxy's IAP audience, known after the first apply with the cluster objects (see terraform/README.md); empty until then: the proxy refuses every request."
  default     = ""
}

variable "manage_kubernetes" {
  type        = bool
  description = "Apply the in-cluster objects; false for the very first apply (the cluster does not exist yet)."
  default     = true
}

variable "autopilot" {
  type        = bool
  description = "A GKE Autopilot cluster instead of Standard (see modules/stasis)."
  default     = false
}

variable "kueue" {
  type        = bool
  description = "Kueue admits workspace pods and JobSets (install Kueue v0.19 first; see modules/stasis)."
  default     = false
}
