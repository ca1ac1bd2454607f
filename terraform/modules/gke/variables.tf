variable "project_id" {
  type        = string
  description = "Project of the cluster."
}

variable "name" {
  type        = string
  description = "Cluster name."
  default     = "stasis"
}

variable "location" {
  type        = string
  description = "Region (regional control plane) or zone of the cluster. The snapshot bucket must be in the same region for Pod Snapshots."
}

variable "node_locations" {
  type        = list(string)
  description = "Zones of the node pools (empty: GKE's default for the location). Homes are zonal disks: fewer zones, fewer stranded PVCs."
  default     = []
}

variable "network" {
  type        = string
  description = "VPC network id."
}

variable "subnetwork" {
  type        = string
  description = "Subnet id (with secondary ranges \"pods\" and \"services\")."
}

variable "release_channel" {
  type        = string
  description = "GKE release channel."
  default     = "REGULAR"
}

variable "min_master_version" {
  type        = string
  description = "Minimum control plane version; Pod Snapshots need 1.35.3-gke.1234000 or later."
  default     = "1.35"
}

variable "pod_snapshots" {
  type        = bool
  description = "Enable GKE Pod Snapshots (the `pod` snapshot method: whole pod memory, GPU included)."
  default     = true
}

variable "secrets_kms_key" {
  type        = string
  description = "CMEK key for application-layer encryption of Kubernetes Secrets (in the cluster's region)."
}

variable "disk_kms_key" {
  type        = string
  description = "CMEK key of the nodes' boot disks (in the cluster's region)."
}

variable "system_pool" {
  type = object({
    machine_type = string
    min_nodes    = number
    max_nodes    = number
    disk_size_gb = optional(number, 50)
  })
  description = "The pool without GKE Sandbox (GKE requires one): kube-system, the monitor. Node counts are per zone."
  default = {
    machine_type = "e2-standard-2"
    min_nodes    = 1
    max_nodes    = 3
  }
}

variable "node_pools" {
  type = map(object({
    machine_type      = string
    min_nodes         = optional(number, 0)
    max_nodes         = number
    spot              = optional(bool, false)
    sandbox           = optional(bool, false)
    accelerator_type  = optional(string)
    accelerator_count = optional(number, 0)
    reservation       = optional(string)
    disk_size_gb      = optional(number, 100)
    disk_type         = optional(string, "pd-balanced")
    labels            = optional(map(string), {})
    taints = optional(list(object({
      key    = string
      value  = string
      effect = string
    })), [])
  }))
  description = "Workspace node pools, one per kind of hardware the catalog's profiles ask for (examples/stasis.yaml): CPU on-demand, GPU under GKE Sandbox (needed for Pod Snapshots), Spot. The profiles' node selectors must match (GKE labels accelerators and Spot nodes itself)."
}

variable "deletion_protection" {
  type        = bool
  description = "Refuse `terraform destroy` of the cluster."
  default     = true
}

variable "labels" {
  type        = map(string)
  description = "Labels on the cluster and its nodes."
  default     = {}
}

variable "kms_ready" {
  type        = list(string)
  description = "Ids of the KMS grants to the GKE and Compute Engine agents."
  default     = []
}

variable "autopilot" {
  type        = bool
  description = "GKE Autopilot instead of Standard: no node pools (system_pool and node_pools unused), nodes provisioned per pod; Pod Snapshots and GKE Sandbox are available there too."
  default     = false
}
