output "network_id" {
  description = "The VPC network's id."
  value       = google_compute_network.this.id
}

output "network_name" {
  description = "The VPC network's name."
  value       = google_compute_network.this.name
}

output "subnet_id" {
  description = "The subnet's id."
  value       = google_compute_subnetwork.this.id
}

output "subnet_name" {
  description = "The subnet's name."
  value       = google_compute_subnetwork.this.name
}
