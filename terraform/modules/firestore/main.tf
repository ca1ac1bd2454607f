# Firestore (native mode): the single source of truth of the control plane.

resource "terraform_data" "services_ready" {
  input = var.services_ready
}

resource "google_firestore_database" "this" {
  project                           = var.project_id
  name                              = "(default)"
  location_id                       = var.location
  type                              = "FIRESTORE_NATIVE"
  concurrency_mode                  = "PESSIMISTIC"
  point_in_time_recovery_enablement = var.point_in_time_recovery ? "POINT_IN_TIME_RECOVERY_ENABLED" : "POINT_IN_TIME_RECOVERY_DISABLED"
  delete_protection_state           = var.delete_protection ? "DELETE_PROTECTION_ENABLED" : "DELETE_PROTECTION_DISABLED"
  deletion_policy                   = var.delete_protection ? "ABANDON" : "DELETE"

  dynamic "cmek_config" {
    for_each = var.kms_key == null ? [] : [var.kms_key]
    content {
      kms_key_name = cmek_config.value
    }
  }
  depends_on = [terraform_data.services_ready]
}

resource "google_firestore_index" "composite" {
  for_each = { for index in var.composite_indexes : "${index.collection}:${join(",", index.fields)}" => index }

  project     = var.project_id
  database    = google_firestore_database.this.name
  collection  = each.value.collection
  query_scope = "COLLECTION"

  dynamic "fields" {
    for_each = each.value.fields
    content {
      field_path   = split(":", fields.value)[0]
      order        = endswith(fields.value, ":contains") ? null : (endswith(fields.value, ":desc") ? "DESCENDING" : "ASCENDING")
      array_config = endswith(fields.value, ":contains") ? "CONTAINS" : null
    }
  }
}

resource "google_firestore_field" "ttl" {
  for_each = local.ttl_fields

  project    = var.project_id
  database   = google_firestore_database.this.name
  collection = each.value.collection
  field      = each.value.field

  ttl_config {}

  dynamic "index_config" {
    for_each = each.value.index ? [] : [1]
    content {}
  }
}
