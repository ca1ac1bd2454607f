# Filled by `stasis bundle`, which writes stasis.auto.tfvars.json next to this file from the
# code (deploy/tfvars.py): functions/routes.py, events.CATALOG, functions/delivery.py, the
# queries the stores declare and the Kubernetes builders. Never set these by hand.

variable "source_archive" {
  type        = string
  description = "Generated: path of the functions' source zip (relative to this directory)."
}

variable "source_sha256" {
  type        = string
  description = "Generated: sha256 of the source zip."
}

variable "event_topics" {
  type        = map(string)
  description = "Generated: event name -> Pub/Sub topic."
}

variable "max_delivery_attempts" {
  type        = number
  description = "Generated: deliveries before dead-lettering (functions/delivery.py MAX_DELIVERY_ATTEMPTS)."
}

variable "event_functions" {
  type = map(object({
    kind                     = string
    access                   = string
    deploy_name              = string
    account_id               = string
    event                    = string
    topic                    = string
    dead_letter_topic        = string
    subscription             = string
    dead_letter_subscription = string
    ordered                  = bool
  }))
  description = "Generated: the event functions of functions/routes.py and their triggers."
}

variable "http_functions" {
  type = map(object({
    kind        = string
    access      = string
    deploy_name = string
    account_id  = string
    schedule    = optional(string)
  }))
  description = "Generated: the HTTP functions of functions/routes.py, who calls each, and the periodic ones' schedules."
}

variable "kubernetes" {
  type = object({
    manifests = object({
      namespaces = map(string)
      cluster    = map(string)
      namespaced = map(string)
      kueue      = map(string)
    })
    teams = map(object({
      namespace       = string
      snapshot_prefix = string
    }))
    monitor = object({
      namespace       = string
      service_account = string
    })
    workspace_service_account = string
  })
  description = "Generated: the cluster's Stasis objects and the teams of the admin configuration."
}

variable "firestore_indexes" {
  type = list(object({
    collection = string
    fields     = list(string)
  }))
  description = "Generated: the composite indexes the code's declared queries need."
}

variable "monitoring" {
  type = object({
    topic                   = string
    gpu_idle_percent        = number
    gpu_idle_window_seconds = optional(number)
  })
  description = "Generated: the monitoring topic and the GPU-idle alert's threshold and window."
}

variable "event_publishers" {
  type        = map(list(string))
  description = "Generated: event name -> the components that may publish it (functions/domain/publishers.py)."
}
