variable "project_id" {
  type        = string
  description = "Project of the load balancer."
}

variable "region" {
  type        = string
  description = "Region of the functions behind it."
}

variable "name" {
  type        = string
  description = "Prefix of the load balancer's resources."
  default     = "stasis"
}

variable "services" {
  type = map(object({
    service  = string
    hostname = string
    members  = list(string)
  }))
  description = "Function name -> its Cloud Run service, the hostname it is served on, and who IAP lets through (user:, group:, domain:)."
}

variable "oauth_client_id" {
  type        = string
  description = "OAuth client of the IAP consent screen; null uses the Google-managed client (internal users of the organization only)."
  default     = null
}

variable "oauth_client_secret" {
  type        = string
  description = "Secret of oauth_client_id."
  default     = null
  sensitive   = true
}

variable "ssl_policy_min_tls" {
  type        = string
  description = "Minimum TLS version the load balancer accepts."
  default     = "TLS_1_2"
}

variable "labels" {
  type        = map(string)
  description = "Labels on the address and the forwarding rules."
  default     = {}
}
