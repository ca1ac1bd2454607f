output "snapshot_bucket" {
  description = "Name of the snapshot bucket (STASIS_SNAPSHOT_BUCKET)."
  value       = google_storage_bucket.snapshots.name
}

output "source_bucket" {
  description = "Name of the function-source bucket."
  value       = google_storage_bucket.source.name
}

output "access_log_bucket" {
  description = "Name of the bucket that receives the others' access logs."
  value       = google_storage_bucket.access_logs.name
}
