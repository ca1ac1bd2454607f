output "uris" {
  description = "Function name -> its HTTPS endpoint (the Cloud Run URL)."
  value       = { for name, fn in google_cloudfunctions2_function.this : name => fn.service_config[0].uri }
}

output "service_names" {
  description = "Function name -> its Cloud Run service name."
  value       = { for name, fn in google_cloudfunctions2_function.this : name => fn.name }
}

output "service_accounts" {
  description = "Function name -> the e-mail of its own service account."
  value       = { for name, sa in google_service_account.function : name => sa.email }
}
