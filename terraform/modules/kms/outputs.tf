output "key_ids" {
  description = "Key resource ids (projects/.../cryptoKeys/NAME), by key name."
  value       = { for name, key in google_kms_crypto_key.this : name => key.id }
}

output "ready" {
  description = "Depend on this before using a key: the service agents' grants are in place."
  value       = [for g in google_kms_crypto_key_iam_member.users : g.id]
}
