output "cluster_id" {
  description = "projects/P/locations/L/clusters/NAME."
  value       = google_container_cluster.this.id
}

output "name" {
  description = "The cluster's name."
  value       = google_container_cluster.this.name
}

output "dns_endpoint" {
  description = "The control plane's DNS endpoint (IAM-authenticated; https://<this>)."
  value       = google_container_cluster.this.control_plane_endpoints_config[0].dns_endpoint_config[0].endpoint
}

output "workload_pool" {
  description = "The Workload Identity pool (PROJECT.svc.id.goog)."
  value       = "${var.project_id}.svc.id.goog"
}
