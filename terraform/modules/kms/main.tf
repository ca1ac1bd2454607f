# Customer-managed encryption keys. Each key is granted to the service agent that uses it
# (Cloud Storage, Pub/Sub, Secret Manager, Compute Engine for disks, GKE for secrets,
# Artifact Registry): callers never need KMS permissions, the service does the crypto.

resource "google_kms_key_ring" "this" {
  project  = var.project_id
  name     = var.key_ring
  location = var.location
}

resource "google_kms_crypto_key" "this" {
  for_each = var.keys

  name            = each.key
  key_ring        = google_kms_key_ring.this.id
  rotation_period = var.rotation_period
  purpose         = "ENCRYPT_DECRYPT"
  labels          = var.labels

  lifecycle {
    # Data encrypted with a destroyed key is lost for good.
    prevent_destroy = true
  }
}

locals {
  grants = merge([
    for key, spec in var.keys : {
      for member in spec.users : "${key}/${member}" => { key = key, member = member }
    }
  ]...)
}

resource "google_kms_crypto_key_iam_member" "users" {
  for_each = local.grants

  crypto_key_id = google_kms_crypto_key.this[each.value.key].id
  role          = "roles/cloudkms.cryptoKeyEncrypterDecrypter"
  member        = each.value.member
}
