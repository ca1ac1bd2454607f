# Secret Manager: the secrets the functions' settings read (tests/unit/test_terraform.py
# checks that every secret-like variable the bundled code reads is declared here).

resource "terraform_data" "kms_ready" {
  input = var.kms_ready
}

resource "google_secret_manager_secret" "this" {
  for_each = var.secrets

  project   = var.project_id
  secret_id = each.value.secret_id
  labels    = merge(var.labels, { env = lower(each.key) })
  annotations = {
    description = each.value.description
  }

  replication {
    user_managed {
      replicas {
        location = var.region
        customer_managed_encryption {
          kms_key_name = var.kms_key
        }
      }
    }
  }
  depends_on = [terraform_data.kms_ready]
}

resource "google_secret_manager_secret_version" "initial" {
  for_each = nonsensitive(toset([for name in keys(var.values) : name if contains(keys(var.secrets), name)]))

  secret      = google_secret_manager_secret.this[each.value].id
  secret_data = var.values[each.value]
}

locals {
  accessors = merge([
    for env, spec in var.secrets : {
      for member in spec.accessors : "${env}/${member}" => { env = env, member = member }
    }
  ]...)
}

resource "google_secret_manager_secret_iam_member" "accessors" {
  for_each = local.accessors

  project   = var.project_id
  secret_id = google_secret_manager_secret.this[each.value.env].secret_id
  role      = "roles/secretmanager.secretAccessor"
  member    = each.value.member
}
