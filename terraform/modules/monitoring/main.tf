# Triggers from cluster monitoring (functions/handlers/monitoring.py): Cloud Monitoring alert
# policies on the workspace containers (GPU duty cycle, GPU memory, OOM kills) notify a
# Pub/Sub channel; a log sink routes Spot preemptions and node deletions; the Alertmanager
# webhook relays its alerts. All of them land on one topic (the Raw route of
# functions/routes.py), which modules/pubsub creates and pushes to the on_monitoring
# function, with a dead-letter topic for what it refuses.
#
# The topic, the threshold and the window come from the code and the admin configuration
# through `stasis bundle` (var.monitoring): the GPU threshold is the idle policy's own
# (functions/domain/idle.py GPU_BUSY_PERCENT) and the window the shortest idle time after
# which a GPU profile pauses. An alert is evidence: the idle policy still decides.

locals {
  # Stasis's workspace containers: the labels the Kubernetes builders put on the pod
  # (functions/kubernetes/objects), which GKE exposes as metadata.user_labels.
  workspaces         = "resource.type = \"k8s_container\" AND metadata.user_labels.\"app.kubernetes.io/managed-by\" = \"stasis\" AND metadata.user_labels.\"app.kubernetes.io/component\" = \"workspace\""
  notification_agent = "service-${var.project_number}@gcp-sa-monitoring-notification.iam.gserviceaccount.com"
  gpu_idle           = var.monitoring.gpu_idle_window_seconds == null ? {} : { gpu_idle = var.monitoring.gpu_idle_window_seconds }
  documentation      = "Sent to Stasis (the on_monitoring function), which turns it into an event for the workspace named by the pod's stasis.dev/workspace label. The workspace's policy decides what happens; nothing here pauses or stops anything by itself."
}

# --- who may publish onto the topic (modules/pubsub makes it and its subscription) --------
resource "google_pubsub_topic_iam_binding" "publishers" {
  project = var.project_id
  topic   = var.topic_id
  role    = "roles/pubsub.publisher"
  # Cloud Monitoring's notification agent (it exists once a Pub/Sub channel does), the log
  # sink's own writer, the webhook relay and operators replaying a saved notification.
  members = sort(distinct(concat(
    ["serviceAccount:${local.notification_agent}", google_logging_project_sink.nodes.writer_identity],
    var.publishers,
  )))
  depends_on = [google_monitoring_notification_channel.pubsub]
}

# --- Cloud Monitoring: the channel and the alert policies ------------------------------------
resource "google_monitoring_notification_channel" "pubsub" {
  project      = var.project_id
  display_name = "Stasis monitoring triggers"
  description  = "Incidents of the Stasis alert policies, to the on_monitoring function."
  type         = "pubsub"
  labels = {
    topic = var.topic_id
  }
  user_labels = var.labels
}

# A workspace's GPU quiet for the window: the idle policy then asks its kernels.
resource "google_monitoring_alert_policy" "gpu_idle" {
  for_each = local.gpu_idle

  project               = var.project_id
  display_name          = "stasis-gpu-idle"
  combiner              = "OR"
  notification_channels = [google_monitoring_notification_channel.pubsub.id]
  user_labels           = merge(var.labels, { stasis_signal = "gpu_idle" })

  conditions {
    display_name = "Workspace GPU duty cycle under ${var.monitoring.gpu_idle_percent}% for ${each.value / 60} minutes"
    condition_threshold {
      filter                  = "${local.workspaces} AND metric.type = \"kubernetes.io/container/accelerator/duty_cycle\""
      comparison              = "COMPARISON_LT"
      threshold_value         = var.monitoring.gpu_idle_percent
      duration                = "${each.value}s"
      evaluation_missing_data = "EVALUATION_MISSING_DATA_INACTIVE"
      aggregations {
        alignment_period   = "60s"
        per_series_aligner = "ALIGN_MAX"
      }
      trigger {
        count = 1
      }
    }
  }

  alert_strategy {
    auto_close           = "1800s"
    notification_prompts = ["OPENED", "CLOSED"]
  }

  documentation {
    subject   = "Stasis: workspace GPU idle"
    content   = local.documentation
    mime_type = "text/markdown"
  }
}

# GPU memory near full: a larger model or batch is about to fail; the owner is told.
resource "google_monitoring_alert_policy" "gpu_memory" {
  project               = var.project_id
  display_name          = "stasis-gpu-memory"
  combiner              = "OR"
  notification_channels = [google_monitoring_notification_channel.pubsub.id]
  user_labels           = merge(var.labels, { stasis_signal = "gpu_memory_high" })

  conditions {
    display_name = "Workspace GPU memory over ${var.gpu_memory_ratio * 100}% for 5 minutes"
    condition_threshold {
      filter             = "${local.workspaces} AND metric.type = \"kubernetes.io/container/accelerator/memory_used\""
      denominator_filter = "${local.workspaces} AND metric.type = \"kubernetes.io/container/accelerator/memory_total\""
      comparison         = "COMPARISON_GT"
      threshold_value    = var.gpu_memory_ratio
      duration           = "300s"
      aggregations {
        alignment_period   = "60s"
        per_series_aligner = "ALIGN_MEAN"
      }
      denominator_aggregations {
        alignment_period   = "60s"
        per_series_aligner = "ALIGN_MEAN"
      }
      trigger {
        count = 1
      }
    }
  }

  alert_strategy {
    auto_close           = "1800s"
    notification_prompts = ["OPENED"]
  }

  documentation {
    subject   = "Stasis: workspace GPU memory near full"
    content   = local.documentation
    mime_type = "text/markdown"
  }
}

# A workspace container OOM-killed (its kernels restart empty): kube-state-metrics through
# Managed Service for Prometheus (the cluster's POD metrics package, modules/gke).
resource "google_monitoring_alert_policy" "oom_killed" {
  project               = var.project_id
  display_name          = "stasis-oom-killed"
  combiner              = "OR"
  notification_channels = [google_monitoring_notification_channel.pubsub.id]
  user_labels           = merge(var.labels, { stasis_signal = "oom_killed" })

  conditions {
    display_name = "Workspace container OOM-killed"
    condition_prometheus_query_language {
      query               = "max by (namespace, pod, container) (kube_pod_container_status_last_terminated_reason{reason=\"OOMKilled\", namespace=~\"${var.namespace_prefix}.+\"}) and on (namespace, pod, container) (increase(kube_pod_container_status_restarts_total{namespace=~\"${var.namespace_prefix}.+\"}[10m]) > 0)"
      duration            = "0s"
      evaluation_interval = "60s"
    }
  }

  alert_strategy {
    auto_close           = "1800s"
    notification_prompts = ["OPENED"]
  }

  documentation {
    subject   = "Stasis: workspace container OOM-killed"
    content   = local.documentation
    mime_type = "text/markdown"
  }
}

# --- Cloud Logging: Spot preemptions and node deletions ------------------------------------
resource "google_logging_project_sink" "nodes" {
  project                = var.project_id
  name                   = "stasis-node-losses"
  description            = "Spot preemptions of GKE nodes and node deletions of the cluster, to Stasis (on_monitoring)."
  destination            = "pubsub.googleapis.com/${var.topic_id}"
  unique_writer_identity = true
  filter                 = <<-EOT
    (log_id("cloudaudit.googleapis.com/system_event") AND resource.type="gce_instance"
     AND protoPayload.methodName="compute.instances.preempted"
     AND protoPayload.resourceName:"/instances/gke-")
    OR (log_id("cloudaudit.googleapis.com/activity") AND resource.type="k8s_cluster"
     AND resource.labels.cluster_name="${var.cluster_name}"
     AND protoPayload.methodName="io.k8s.core.v1.nodes.delete")
  EOT
}
