# What Terraform applies inside the cluster: the control plane's RBAC (verb-minimal
# ClusterRoles bound to the functions' identities, no wildcards: the managers, and the
# read-only readers), the cluster monitor
# (namespace, service account with Workload Identity, read-only ClusterRole, Deployment),
# the CMEK storage classes the catalog's profiles name, and per team its namespace,
# workspace service account, Pod Snapshots storage configuration (the team's bucket prefix)
# and policy. Every object comes from the same Python builders the Kubernetes runtime uses;
# this is the install step: no function creates a namespace's bindings or patches it.
#
# kubernetes_manifest needs the cluster (and, for the Pod Snapshot kinds, its CRDs) at plan
# time: apply the cluster first (see the README's deployment section).

locals {
  subjects = join(",", [
    for email in sort(var.control_plane_members) :
    jsonencode({ kind = "User", name = email, apiGroup = "rbac.authorization.k8s.io" })
  ])
  readers = join(",", [
    for email in sort(var.reader_members) :
    jsonencode({ kind = "User", name = email, apiGroup = "rbac.authorization.k8s.io" })
  ])

  render = {
    for tier, objects in var.manifests : tier => {
      for key, text in objects : key => jsondecode(
        replace(replace(replace(replace(replace(replace(replace(replace(replace(replace(
          replace(replace(replace(replace(text,
            "\"@@RUNTIME_SUBJECTS@@\"", local.subjects),
            "\"@@READER_SUBJECTS@@\"", local.readers),
            "@@PROJECT@@", var.replacements["@@PROJECT@@"]),
          "@@BUCKET@@", var.replacements["@@BUCKET@@"]),
          "@@AGENT_IMAGE@@", var.replacements["@@AGENT_IMAGE@@"]),
          "@@MONITOR_GSA@@", var.replacements["@@MONITOR_GSA@@"]),
          "@@DISK_KMS_KEY@@", var.replacements["@@DISK_KMS_KEY@@"]),
          "@@IDE_HOST@@", var.replacements["@@IDE_HOST@@"]),
          "@@IDE_ADDRESS@@", var.replacements["@@IDE_ADDRESS@@"]),
          "@@IDE_CERTIFICATE@@", var.replacements["@@IDE_CERTIFICATE@@"]),
          "@@IDE_OAUTH_CLIENT_ID@@", var.replacements["@@IDE_OAUTH_CLIENT_ID@@"]),
          "@@IDE_IAP_AUDIENCE@@", var.replacements["@@IDE_IAP_AUDIENCE@@"]),
          "@@IDE_GSA@@", var.replacements["@@IDE_GSA@@"]),
        "@@EMAIL_DOMAIN@@", var.replacements["@@EMAIL_DOMAIN@@"])
      )
    }
  }
}

resource "kubernetes_manifest" "namespaces" {
  for_each = local.render.namespaces
  manifest = each.value
}

resource "kubernetes_manifest" "cluster" {
  for_each   = local.render.cluster
  manifest   = each.value
  depends_on = [kubernetes_manifest.namespaces]
}

resource "kubernetes_manifest" "namespaced" {
  for_each   = local.render.namespaced
  manifest   = each.value
  depends_on = [kubernetes_manifest.cluster]
}

# Kueue's objects (the Kueue CRDs must exist: install Kueue before `kueue = true`).
resource "kubernetes_manifest" "kueue" {
  for_each   = var.kueue ? local.render.kueue : {}
  manifest   = each.value
  depends_on = [kubernetes_manifest.namespaced]
}

# IAP's OAuth client secret for the IDE proxy's GCPBackendPolicy (key "key", as GKE reads it).
resource "kubernetes_secret_v1" "ide_oauth" {
  metadata {
    name      = var.ide_oauth_secret.name
    namespace = var.ide_oauth_secret.namespace
  }
  data       = { (var.ide_oauth_secret.key) = var.ide_oauth_secret.value }
  depends_on = [kubernetes_manifest.namespaces]
}
