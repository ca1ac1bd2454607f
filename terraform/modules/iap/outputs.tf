output "ip_address" {
  description = "Point each hostname's A record here."
  value       = google_compute_global_address.this.address
}

output "audiences" {
  description = "Function name -> the audience of the IAP JWT it receives (/projects/NUMBER/global/backendServices/ID)."
  value = {
    for name, backend in google_compute_backend_service.this :
    name => "/projects/${data.google_project.this.number}/global/backendServices/${backend.generated_id}"
  }
}

output "urls" {
  description = "Function name -> its public URL (behind IAP)."
  value       = { for name, s in var.services : name => "https://${s.hostname}/" }
}
