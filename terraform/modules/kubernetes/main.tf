# What Terraform applies inside the cluster: the control plane's RBAC (verb-minimal
# ClusterRoles bound to the functions' identities, no wildcards), the cluster monitor
# (namespace, service account with Workload Identity, read-only ClusterRole, Deployment),
# the CMEK storage classes the catalog's profiles name, and per team its namespace,
# workspace service account, Pod Snapshots storage configuration (the team's bucket prefix)
# and policy. Every object comes from the same Python builders the Kubernetes runtime uses;
# the runtime creates the same objects for a team Terraform does not know yet.
#
# kubernetes_manifest needs the cluster (and, for the Pod Snapshot kinds, its CRDs) at plan
# time: apply the cluster first (see the README's deployment section).

locals {
  subjects = join(",", [
    for email in sort(var.control_plane_members) :
    jsonencode({ kind = "User", name = email, apiGroup = "rbac.authorization.k8s.io" })
  ])

  render = {
    for tier, objects in var.manifests : tier => {
      for key, text in objects : key => jsondecode(
        replace(replace(replace(replace(replace(replace(text,
          "\"@@RUNTIME_SUBJECTS@@\"", local.subjects),
          "@@PROJECT@@", var.replacements["@@PROJECT@@"]),
          "@@BUCKET@@", var.replacements["@@BUCKET@@"]),
          "@@AGENT_IMAGE@@", var.replacements["@@AGENT_IMAGE@@"]),
          "@@MONITOR_GSA@@", var.replacements["@@MONITOR_GSA@@"]),
        "@@DISK_KMS_KEY@@", var.replacements["@@DISK_KMS_KEY@@"])
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
