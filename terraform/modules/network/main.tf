# One VPC for the cluster (private nodes) and the functions that reach the workspaces
# (Direct VPC egress). Nodes have no public address: Cloud NAT gives them egress, Private
# Google Access reaches Google APIs without it.

resource "google_compute_network" "this" {
  project                 = var.project_id
  name                    = var.name
  auto_create_subnetworks = false
  routing_mode            = "REGIONAL"
}

resource "google_compute_subnetwork" "this" {
  project                  = var.project_id
  name                     = "${var.name}-${var.region}"
  region                   = var.region
  network                  = google_compute_network.this.id
  ip_cidr_range            = var.subnet_cidr
  private_ip_google_access = true

  secondary_ip_range {
    range_name    = "pods"
    ip_cidr_range = var.pods_cidr
  }
  secondary_ip_range {
    range_name    = "services"
    ip_cidr_range = var.services_cidr
  }

  log_config {
    aggregation_interval = "INTERVAL_5_SEC"
    flow_sampling        = var.flow_log_sampling
    metadata             = "INCLUDE_ALL_METADATA"
  }
}

resource "google_compute_router" "this" {
  project = var.project_id
  name    = "${var.name}-${var.region}"
  region  = var.region
  network = google_compute_network.this.id
}

resource "google_compute_router_nat" "this" {
  project                            = var.project_id
  name                               = "${var.name}-${var.region}"
  router                             = google_compute_router.this.name
  region                             = var.region
  nat_ip_allocate_option             = "AUTO_ONLY"
  source_subnetwork_ip_ranges_to_nat = "ALL_SUBNETWORKS_ALL_IP_RANGES"

  log_config {
    enable = true
    filter = "ERRORS_ONLY"
  }
}

# Ingress is denied unless allowed below (GKE adds the rules its control plane and load
# balancers need). The functions with Direct VPC egress reach the workspaces' Jupyter
# server and snapshot agent, and nothing else.
resource "google_compute_firewall" "deny_ingress" {
  project   = var.project_id
  name      = "${var.name}-deny-ingress"
  network   = google_compute_network.this.id
  direction = "INGRESS"
  priority  = 65000

  deny {
    protocol = "all"
  }
  source_ranges = ["0.0.0.0/0"]

  log_config {
    metadata = "INCLUDE_ALL_METADATA"
  }
}

resource "google_compute_firewall" "functions_to_workspaces" {
  project     = var.project_id
  name        = "${var.name}-functions-to-workspaces"
  network     = google_compute_network.this.id
  direction   = "INGRESS"
  priority    = 1000
  source_tags = [var.functions_tag]

  allow {
    protocol = "tcp"
    ports    = var.workspace_ports
  }
  destination_ranges = [var.pods_cidr]

  log_config {
    metadata = "INCLUDE_ALL_METADATA"
  }
}
