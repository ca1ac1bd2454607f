output "notification_channel" {
  description = "The Pub/Sub notification channel: add it to your own alert policies on workspace containers (label them stasis_signal=gpu_idle|gpu_memory_high|oom_killed)."
  value       = google_monitoring_notification_channel.pubsub.id
}

output "alert_policies" {
  description = "The Stasis alert policies, by signal."
  value = merge(
    { for k, p in google_monitoring_alert_policy.gpu_idle : k => p.id },
    { gpu_memory_high = google_monitoring_alert_policy.gpu_memory.id, oom_killed = google_monitoring_alert_policy.oom_killed.id },
  )
}
