variable "project_id" {
  type        = string
  description = "Project of the network."
}

variable "region" {
  type        = string
  description = "Region of the subnet (the GKE cluster and the functions' VPC egress)."
}

variable "name" {
  type        = string
  description = "Name of the VPC network (also prefixes the subnet, router and NAT)."
  default     = "stasis"
}

variable "subnet_cidr" {
  type        = string
  description = "Primary range of the subnet: nodes, and the functions' Direct VPC egress addresses."
  default     = "10.10.0.0/20"
}

variable "pods_cidr" {
  type        = string
  description = "Secondary range for GKE pods."
  default     = "10.16.0.0/14"
}

variable "services_cidr" {
  type        = string
  description = "Secondary range for GKE services."
  default     = "10.20.0.0/20"
}

variable "flow_log_sampling" {
  type        = number
  description = "Share of VPC flow logs kept (0-1); flow logs are billed per GB."
  default     = 0.1
}

variable "functions_tag" {
  type        = string
  description = "Network tag of the functions' Direct VPC egress (modules/functions sets it)."
  default     = "stasis-functions"
}

variable "workspace_ports" {
  type        = list(string)
  description = "Ports of a workspace pod the functions may reach: the IDE (Jupyter) and the snapshot agent."
  default     = ["8888", "8890"]
}
