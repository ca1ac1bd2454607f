# Each function's own account gets exactly what it does (topics: modules/pubsub; secrets:
# modules/secrets; invokers: modules/functions). Firestore has no finer IAM than the
# database: the dashboard reads, the others read and write.

resource "google_project_iam_member" "firestore" {
  for_each = local.functions

  project = var.project_id
  role    = contains(local.read_only, each.key) ? "roles/datastore.viewer" : "roles/datastore.user"
  member  = local.member[each.key]
}

resource "google_storage_bucket_iam_member" "snapshots" {
  for_each = toset(local.snapshot_users)

  bucket = module.storage.snapshot_bucket
  role   = "roles/storage.objectUser"
  member = local.member[each.value]
}

# Reaching the control plane's DNS endpoint and reading the cluster; what a function may do
# inside is Kubernetes RBAC (modules/kubernetes), bound to the same identities.
resource "google_project_iam_member" "cluster" {
  for_each = toset(var.runtime == "kubernetes" ? local.cluster_users : [])

  project = var.project_id
  role    = "roles/container.clusterViewer"
  member  = local.member[each.value]
}

# A function without a private key signs V4 URLs through IAM signBlob as itself.
resource "google_service_account_iam_member" "url_signer" {
  for_each = toset(var.runtime == "kubernetes" ? [for n in local.names : n if can(regex(var.url_signing_pattern, n))] : [])

  service_account_id = "projects/${var.project_id}/serviceAccounts/${module.functions.service_accounts[each.value]}"
  role               = "roles/iam.serviceAccountTokenCreator"
  member             = local.member[each.value]
}

# --- the cluster monitor -------------------------------------------------------------------------
# It reads what sandbox collectors and job hosts leave in the bucket (exit status, logs).
resource "google_storage_bucket_iam_member" "monitor_objects" {
  bucket = module.storage.snapshot_bucket
  role   = "roles/storage.objectViewer"
  member = google_service_account.monitor.member
}

resource "google_service_account_iam_member" "monitor_workload_identity" {
  service_account_id = google_service_account.monitor.name
  role               = "roles/iam.workloadIdentityUser"
  member             = "serviceAccount:${module.gke.workload_pool}[${var.kubernetes.monitor.namespace}/${var.kubernetes.monitor.service_account}]"
}

# --- workspaces: no pod identity writes a workspace's snapshots ---------------------------------
# Kernel snapshots (method kernel) are written by the sidecar and the kernel with a token the
# cluster monitor mints for that one snapshot or restore: its own credential, downscoped by a
# Credential Access Boundary to the workspace's own folder, snapshots/<team>/<workspace>/
# (functions/domain/snapshot_access.py). A boundary only takes permissions away, so the monitor
# holds objectUser on every team's snapshot folder (below), and the workspace pods' identities
# hold nothing there: a teammate's kernel cannot write another workspace's snapshots. The token
# exchange (Security Token Service, enabled in modules/project) needs no role of its own.
#
# The one exception is GKE's Pod Snapshots (method pod, tokenSource podKSA): GKE writes them as
# the pod's Kubernetes service account, under the team's snapshots/<team>/pod/ only. Workload
# Identity Federation names every KSA of the team's namespace directly (a principalSet, no
# Google service account); its object role is on that managed folder, not on the bucket:
# storage.objects.list is checked against the bucket, so a bucket-level grant (even one
# conditioned on resource.name) would list every object name in it, other teams' workspace,
# snapshot and sandbox ids included. The bucket-level role below is bucketViewer (the bucket's
# metadata, no object names).
locals {
  team_principal = {
    for team, t in var.kubernetes.teams : team =>
    "principalSet://iam.googleapis.com/projects/${module.project.project_number}/locations/global/workloadIdentityPools/${module.gke.workload_pool}/namespace/${t.namespace}"
  }
}

resource "google_storage_managed_folder" "team" {
  for_each = var.kubernetes.teams

  bucket = module.storage.snapshot_bucket
  name   = each.value.snapshot_prefix
}

# What the monitor's downscoped tokens may use: read and write the team's snapshots.
resource "google_storage_managed_folder_iam_member" "monitor_snapshots" {
  for_each = var.kubernetes.teams

  bucket         = module.storage.snapshot_bucket
  managed_folder = google_storage_managed_folder.team[each.key].name
  role           = "roles/storage.objectUser"
  member         = google_service_account.monitor.member
}

# GKE's Pod Snapshots of the team's pods (retention.POD_DIR).
resource "google_storage_managed_folder" "team_pod" {
  for_each = var.kubernetes.teams

  bucket = module.storage.snapshot_bucket
  name   = "${each.value.snapshot_prefix}pod/"

  depends_on = [google_storage_managed_folder.team]
}

resource "google_storage_managed_folder_iam_member" "team_pod_snapshots" {
  for_each = var.kubernetes.teams

  bucket         = module.storage.snapshot_bucket
  managed_folder = google_storage_managed_folder.team_pod[each.key].name
  role           = "roles/storage.objectUser"
  member         = local.team_principal[each.key]
}

resource "google_storage_bucket_iam_member" "team_bucket" {
  for_each = var.kubernetes.teams

  bucket = module.storage.snapshot_bucket
  role   = "roles/storage.bucketViewer"
  member = local.team_principal[each.key]
}

# GKE's own agent deletes the objects of a PodSnapshot that is deleted.
resource "google_storage_bucket_iam_member" "gke_agent" {
  bucket = module.storage.snapshot_bucket
  role   = "roles/storage.objectUser"
  member = "serviceAccount:${module.project.agents.container}"
}

# --- the IDE access proxy --------------------------------------------------------------------------
# It reads workspaces and teams (the access rule) and publishes workspace.resume_requested.
resource "google_project_iam_member" "ide_proxy_firestore" {
  project = var.project_id
  role    = "roles/datastore.viewer"
  member  = google_service_account.ide_proxy.member
}

resource "google_service_account_iam_member" "ide_proxy_workload_identity" {
  service_account_id = google_service_account.ide_proxy.name
  role               = "roles/iam.workloadIdentityUser"
  member             = "serviceAccount:${module.gke.workload_pool}[${var.kubernetes.ide_proxy.namespace}/${var.kubernetes.ide_proxy.service_account}]"
}
