output "jobs" {
  description = "Function name -> job name."
  value       = { for name, job in google_cloud_scheduler_job.this : name => job.name }
}
