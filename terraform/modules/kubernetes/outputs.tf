output "objects" {
  description = "Keys of the objects applied."
  value       = concat(keys(kubernetes_manifest.namespaces), keys(kubernetes_manifest.cluster), keys(kubernetes_manifest.namespaced))
}
