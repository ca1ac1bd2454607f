# The GKE cluster workspaces run on: private nodes, Workload Identity, Dataplane V2
# (NetworkPolicy), Kubernetes Secrets under CMEK, Pod Snapshots, and a control plane that is
# reached only through its IAM-authenticated DNS endpoint (the functions and Terraform use
# Google credentials; there is no public IP endpoint to allow-list).

data "google_project" "this" {
  project_id = var.project_id
}

resource "terraform_data" "kms_ready" {
  input = var.kms_ready
}

resource "google_service_account" "nodes" {
  project      = var.project_id
  account_id   = "stasis-gke-nodes"
  display_name = "Stasis GKE nodes"
  description  = "Node identity: logs, metrics, image pulls. Workloads use Workload Identity instead."
}

resource "google_project_iam_member" "nodes" {
  for_each = toset([
    "roles/container.defaultNodeServiceAccount",
    "roles/artifactregistry.reader",
  ])

  project = var.project_id
  role    = each.value
  member  = google_service_account.nodes.member
}

resource "google_container_cluster" "this" {
  #checkov:skip=CKV_GCP_65:Google Groups for RBAC needs a Google Workspace / Cloud Identity domain group; Stasis binds RBAC to its functions' service accounts instead (modules/kubernetes).
  #checkov:skip=CKV_GCP_66:Binary Authorization needs an attestation pipeline for the IDE images the admin catalog names; enable it with your organization's policy.
  #checkov:skip=CKV_GCP_20:There is no IP endpoint to restrict: ip_endpoints_config is off and the control plane is reached only through its IAM-authenticated DNS endpoint.
  project            = var.project_id
  name               = var.name
  location           = var.location
  node_locations     = length(var.node_locations) > 0 ? var.node_locations : null
  network            = var.network
  subnetwork         = var.subnetwork
  min_master_version = var.min_master_version
  # Autopilot (var.autopilot): GKE provisions nodes per pod; node pools, the default pool's
  # config, the datapath (always Dataplane V2) and shielded nodes (always on) are its own.
  enable_autopilot            = var.autopilot ? true : null
  remove_default_node_pool    = var.autopilot ? null : true
  initial_node_count          = var.autopilot ? null : 1
  deletion_protection         = var.deletion_protection
  datapath_provider           = var.autopilot ? null : "ADVANCED_DATAPATH"
  enable_intranode_visibility = true
  enable_shielded_nodes       = var.autopilot ? null : true
  enable_legacy_abac          = false
  resource_labels             = var.labels

  release_channel {
    channel = var.release_channel
  }

  workload_identity_config {
    workload_pool = "${var.project_id}.svc.id.goog"
  }

  ip_allocation_policy {
    cluster_secondary_range_name  = "pods"
    services_secondary_range_name = "services"
  }

  private_cluster_config {
    enable_private_nodes    = true
    enable_private_endpoint = true
  }

  control_plane_endpoints_config {
    dns_endpoint_config {
      allow_external_traffic = true
    }
    ip_endpoints_config {
      enabled = false
    }
  }

  master_auth {
    client_certificate_config {
      issue_client_certificate = false
    }
  }

  # Dataplane V2 enforces NetworkPolicy itself; the Calico add-on stays off (Autopilot has
  # no such setting).
  dynamic "network_policy" {
    for_each = var.autopilot ? [] : [1]
    content {
      enabled = false
    }
  }

  # Autopilot's nodes run as the same least-privilege service account.
  dynamic "cluster_autoscaling" {
    for_each = var.autopilot ? [1] : []
    content {
      auto_provisioning_defaults {
        service_account = google_service_account.nodes.email
        oauth_scopes    = ["https://www.googleapis.com/auth/cloud-platform"]
      }
    }
  }

  database_encryption {
    state    = "ENCRYPTED"
    key_name = var.secrets_kms_key
  }

  addons_config {
    pod_snapshot_config {
      enabled = var.pod_snapshots
    }
    gce_persistent_disk_csi_driver_config {
      enabled = true
    }
  }

  logging_config {
    enable_components = ["SYSTEM_COMPONENTS", "WORKLOADS"]
  }

  # POD: kube-state-metrics' pod metrics (Managed Service for Prometheus), which the
  # OOM-killed alert of modules/monitoring reads; SYSTEM_COMPONENTS carries the GPU ones.
  monitoring_config {
    enable_components = ["SYSTEM_COMPONENTS", "POD"]
    managed_prometheus {
      enabled = true
    }
  }

  security_posture_config {
    mode               = "BASIC"
    vulnerability_mode = "VULNERABILITY_BASIC"
  }

  # The default pool is removed at once; its config only has to be valid and hardened.
  dynamic "node_config" {
    for_each = var.autopilot ? [] : [1]
    content {
      service_account = google_service_account.nodes.email
      oauth_scopes    = ["https://www.googleapis.com/auth/cloud-platform"]
      image_type      = "COS_CONTAINERD"
      workload_metadata_config {
        mode = "GKE_METADATA"
      }
      shielded_instance_config {
        enable_secure_boot          = true
        enable_integrity_monitoring = true
      }
      metadata = {
        disable-legacy-endpoints = "true"
      }
    }
  }

  depends_on = [terraform_data.kms_ready, google_project_iam_member.nodes]
}

resource "google_container_node_pool" "system" {
  count    = var.autopilot ? 0 : 1
  project  = var.project_id
  name     = "system"
  cluster  = google_container_cluster.this.id
  location = var.location

  autoscaling {
    min_node_count = var.system_pool.min_nodes
    max_node_count = var.system_pool.max_nodes
  }

  management {
    auto_repair  = true
    auto_upgrade = true
  }

  node_config {
    machine_type      = var.system_pool.machine_type
    disk_size_gb      = var.system_pool.disk_size_gb
    image_type        = "COS_CONTAINERD"
    service_account   = google_service_account.nodes.email
    oauth_scopes      = ["https://www.googleapis.com/auth/cloud-platform"]
    boot_disk_kms_key = var.disk_kms_key
    labels            = merge(var.labels, { "stasis.dev/pool" = "system" })

    workload_metadata_config {
      mode = "GKE_METADATA"
    }
    shielded_instance_config {
      enable_secure_boot          = true
      enable_integrity_monitoring = true
    }
    metadata = {
      disable-legacy-endpoints = "true"
    }
  }
}

resource "google_container_node_pool" "workspaces" {
  for_each = var.autopilot ? {} : var.node_pools

  project  = var.project_id
  name     = each.key
  cluster  = google_container_cluster.this.id
  location = var.location

  autoscaling {
    min_node_count = each.value.min_nodes
    max_node_count = each.value.max_nodes
  }

  management {
    auto_repair  = true
    auto_upgrade = true
  }

  node_config {
    machine_type      = each.value.machine_type
    image_type        = "COS_CONTAINERD"
    spot              = each.value.spot
    disk_size_gb      = each.value.disk_size_gb
    disk_type         = each.value.disk_type
    service_account   = google_service_account.nodes.email
    oauth_scopes      = ["https://www.googleapis.com/auth/cloud-platform"]
    boot_disk_kms_key = var.disk_kms_key
    labels            = merge(var.labels, each.value.labels, { "stasis.dev/pool" = each.key })

    # GKE taints GPU, TPU and sandbox nodes itself; these are the others (e.g. Spot CPU).
    dynamic "taint" {
      for_each = each.value.taints
      content {
        key    = taint.value.key
        value  = taint.value.value
        effect = taint.value.effect
      }
    }

    dynamic "sandbox_config" {
      for_each = each.value.sandbox ? [1] : []
      content {
        sandbox_type = "gvisor"
      }
    }

    dynamic "guest_accelerator" {
      for_each = each.value.accelerator_type == null ? [] : [each.value]
      content {
        type  = guest_accelerator.value.accelerator_type
        count = guest_accelerator.value.accelerator_count
        gpu_driver_installation_config {
          gpu_driver_version = "LATEST"
        }
      }
    }

    dynamic "reservation_affinity" {
      for_each = each.value.reservation == null ? [] : [each.value.reservation]
      content {
        consume_reservation_type = "SPECIFIC_RESERVATION"
        key                      = "compute.googleapis.com/reservation-name"
        values                   = [reservation_affinity.value]
      }
    }

    workload_metadata_config {
      mode = "GKE_METADATA"
    }
    shielded_instance_config {
      enable_secure_boot          = true
      enable_integrity_monitoring = true
    }
    metadata = {
      disable-legacy-endpoints = "true"
    }
  }
}
