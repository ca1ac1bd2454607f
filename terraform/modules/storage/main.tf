# Snapshots: the kernel method writes snapshots/<team>/<workspace>/<snapshot>/ (manifest
# last), GKE Pod Snapshots write snapshots/<team>/pod/. Per-team prefixes let IAM keep one
# team's workspaces out of another's snapshots (see modules/stasis, iam_teams.tf).

resource "google_storage_bucket" "access_logs" {
  #checkov:skip=CKV_GCP_62:This bucket receives the other buckets' access logs; logging it into itself would loop.
  project                     = var.project_id
  name                        = "${var.name_prefix}-access-logs"
  location                    = var.source_location
  uniform_bucket_level_access = true
  public_access_prevention    = "enforced"
  force_destroy               = var.force_destroy
  labels                      = var.labels

  versioning {
    enabled = true
  }
  encryption {
    default_kms_key_name = var.source_kms_key
  }
  lifecycle_rule {
    condition {
      age = 90
    }
    action {
      type = "Delete"
    }
  }
  lifecycle_rule {
    condition {
      days_since_noncurrent_time = 7
    }
    action {
      type = "Delete"
    }
  }
  depends_on = [terraform_data.kms_ready]
}

resource "terraform_data" "kms_ready" {
  input = var.kms_ready
}

resource "google_storage_bucket" "snapshots" {
  #checkov:skip=CKV_GCP_78:Hierarchical-namespace buckets cannot have object versioning; snapshots are immutable objects with their own retention, and soft delete is configurable.
  project                     = var.project_id
  name                        = "${var.name_prefix}-snapshots"
  location                    = var.snapshot_location
  storage_class               = "STANDARD"
  uniform_bucket_level_access = true
  public_access_prevention    = "enforced"
  force_destroy               = var.force_destroy
  labels                      = var.labels

  hierarchical_namespace {
    enabled = var.hierarchical_namespace
  }
  soft_delete_policy {
    retention_duration_seconds = var.snapshot_soft_delete_seconds
  }
  encryption {
    default_kms_key_name = var.snapshot_kms_key
  }
  logging {
    log_bucket = google_storage_bucket.access_logs.name
  }

  # The janitor applies retention per profile and team; this only catches what it missed.
  lifecycle_rule {
    condition {
      age = var.snapshot_backstop_days
    }
    action {
      type = "Delete"
    }
  }
  # Parallel (XML multipart) uploads that died midway leave parts behind.
  lifecycle_rule {
    condition {
      age = 1
    }
    action {
      type = "AbortIncompleteMultipartUpload"
    }
  }
  depends_on = [terraform_data.kms_ready]
}

resource "google_storage_bucket" "source" {
  project                     = var.project_id
  name                        = "${var.name_prefix}-functions-source"
  location                    = var.source_location
  uniform_bucket_level_access = true
  public_access_prevention    = "enforced"
  force_destroy               = var.force_destroy
  labels                      = var.labels

  versioning {
    enabled = true
  }
  encryption {
    default_kms_key_name = var.source_kms_key
  }
  logging {
    log_bucket = google_storage_bucket.access_logs.name
  }
  # Bundles are named by their sha256; old ones are only needed for a rollback.
  lifecycle_rule {
    condition {
      age = 90
    }
    action {
      type = "Delete"
    }
  }
  lifecycle_rule {
    condition {
      days_since_noncurrent_time = 30
    }
    action {
      type = "Delete"
    }
  }
  depends_on = [terraform_data.kms_ready]
}
