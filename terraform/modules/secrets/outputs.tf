output "secret_ids" {
  description = "Environment variable -> secret id (short name)."
  value       = { for env, secret in google_secret_manager_secret.this : env => secret.secret_id }
}

output "ready" {
  description = "Depend on this before deploying a function that reads a secret: its access is granted."
  value       = [for a in google_secret_manager_secret_iam_member.accessors : a.id]
}
