# Stasis on Google Cloud: every module wired together. The function list, the topics and
# the cluster objects come from the code through `stasis bundle` (stasis.auto.tfvars.json);
# nothing here names a function or an event.

locals {
  snapshot_location = coalesce(var.snapshot_location, var.region)
  cluster_location  = coalesce(var.cluster_location, var.region)

  functions = merge(
    { for name, f in var.event_functions : name => {
      kind        = f.kind
      access      = f.access
      deploy_name = f.deploy_name
      account_id  = f.account_id
      event       = f.event
      topic       = f.topic
    } },
    { for name, f in var.http_functions : name => {
      kind        = f.kind
      access      = f.access
      deploy_name = f.deploy_name
      account_id  = f.account_id
      event       = null
      topic       = null
    } },
  )
  names = keys(local.functions)

  read_only      = [for n in local.names : n if can(regex(var.read_only_pattern, n))]
  snapshot_users = [for n in local.names : n if can(regex(var.snapshot_access_pattern, n))]
  # Managers drive workspaces in the team namespaces; readers read a workspace's pod and
  # token there (functions/kubernetes/objects/rbac.py). Both reach the workspaces (VPC).
  cluster_managers = [for n in local.names : n if can(regex(var.cluster_access_pattern, n))]
  cluster_readers  = [for n in local.names : n if can(regex(var.cluster_read_pattern, n)) && !contains(local.cluster_managers, n)]
  cluster_users    = concat(local.cluster_managers, local.cluster_readers)
  iap_functions    = { for n, f in local.functions : n => f if f.access == "iap" }
  public_functions = [for n, f in local.functions : n if f.access == "public"]
  schedules = {
    for n, cron in merge(
      { for n, f in var.http_functions : n => f.schedule if f.access == "scheduler" && f.schedule != null },
      var.schedule_overrides,
    ) : n => cron if cron != "" && contains(keys(var.http_functions), n)
  }
  secret_consumers = {
    for env, s in var.secrets : env => [for n in local.names : n if can(regex(s.consumers, n))]
  }
  hostnames = {
    for n, f in local.iap_functions : n => lookup(var.iap_hostnames, n, "${replace(n, "_", "-")}.${var.iap_domain}")
  }
  member = { for n, email in module.functions.service_accounts : n => "serviceAccount:${email}" }

  # Who publishes as each component of var.event_publishers: a function as its own account,
  # what operators publish themselves as the operators, the monitor and the IDE proxy as their Workload Identities.
  # The node agent and the null runtime run only locally; a workspace's jobs API has no
  # identity of its own here. A component missing from this map fails the plan.
  component_members = merge(
    { for n, m in local.member : n => [m] },
    {
      operator     = var.publishers
      ide_proxy    = [google_service_account.ide_proxy.member]
      monitor      = [google_service_account.monitor.member]
      node_agent   = []
      null_runtime = []
      workspace    = []
    },
  )
  topic_publishers = {
    for event, components in var.event_publishers :
    event => sort(distinct(flatten([for c in components : local.component_members[c]])))
  }

  ide_hostname = var.ide_hostname != "" ? var.ide_hostname : "ide.${var.iap_domain}"
}

module "project" {
  source     = "../project"
  project_id = var.project_id
}

module "network" {
  source        = "../network"
  project_id    = var.project_id
  region        = var.region
  subnet_cidr   = var.network.subnet_cidr
  pods_cidr     = var.network.pods_cidr
  services_cidr = var.network.services_cidr
  depends_on    = [module.project]
}

module "kms" {
  source     = "../kms"
  project_id = var.project_id
  location   = var.region
  key_ring   = var.kms_key_ring
  labels     = var.labels
  keys = {
    pubsub    = { users = ["serviceAccount:${module.project.agents.pubsub}"] }
    secrets   = { users = ["serviceAccount:${module.project.agents.secretmanager}"] }
    storage   = { users = ["serviceAccount:${module.project.agents.storage}"] }
    artifacts = { users = ["serviceAccount:${module.project.agents.artifactregistry}"] }
    gke       = { users = ["serviceAccount:${module.project.agents.container}"] }
    disks = { users = [
      "serviceAccount:${module.project.agents.compute}",
      "serviceAccount:${module.project.agents.container}",
    ] }
  }
  depends_on = [module.project]
}

# The snapshot bucket's key must be where the bucket is (a multi-region needs its own ring).
module "kms_snapshots" {
  source     = "../kms"
  count      = lower(local.snapshot_location) == lower(var.region) ? 0 : 1
  project_id = var.project_id
  location   = lower(local.snapshot_location)
  key_ring   = "${var.kms_key_ring}-snapshots"
  labels     = var.labels
  keys = {
    snapshots = { users = ["serviceAccount:${module.project.agents.storage}"] }
  }
  depends_on = [module.project]
}

module "storage" {
  source                       = "../storage"
  project_id                   = var.project_id
  name_prefix                  = var.name_prefix
  snapshot_location            = local.snapshot_location
  source_location              = var.region
  snapshot_kms_key             = length(module.kms_snapshots) > 0 ? module.kms_snapshots[0].key_ids["snapshots"] : module.kms.key_ids["storage"]
  source_kms_key               = module.kms.key_ids["storage"]
  snapshot_backstop_days       = var.snapshot_backstop_days
  snapshot_soft_delete_seconds = var.snapshot_soft_delete_seconds
  force_destroy                = var.force_destroy
  labels                       = var.labels
  kms_ready                    = concat(module.kms.ready, flatten([for k in module.kms_snapshots : k.ready]))
}

module "firestore" {
  source                 = "../firestore"
  project_id             = var.project_id
  location               = var.firestore_location
  point_in_time_recovery = var.firestore_pitr
  delete_protection      = var.firestore_delete_protection
  composite_indexes      = var.firestore_indexes
  services_ready         = module.project.services
}

module "secrets" {
  source     = "../secrets"
  project_id = var.project_id
  region     = var.region
  kms_key    = module.kms.key_ids["secrets"]
  labels     = var.labels
  kms_ready  = module.kms.ready
  values     = var.secret_values
  secrets = {
    for env, s in var.secrets : env => {
      secret_id   = s.secret_id
      description = s.description
      accessors   = [for n in local.secret_consumers[env] : local.member[n]]
    }
  }
  depends_on = [module.project]
}

module "gke" {
  source              = "../gke"
  project_id          = var.project_id
  name                = var.cluster_name
  location            = local.cluster_location
  node_locations      = var.node_locations
  network             = module.network.network_id
  subnetwork          = module.network.subnet_id
  release_channel     = var.release_channel
  min_master_version  = var.min_master_version
  pod_snapshots       = var.pod_snapshots
  autopilot           = var.autopilot
  secrets_kms_key     = module.kms.key_ids["gke"]
  disk_kms_key        = module.kms.key_ids["disks"]
  system_pool         = var.system_pool
  node_pools          = var.node_pools
  deletion_protection = !var.force_destroy
  labels              = var.labels
  kms_ready           = module.kms.ready
}

module "iap" {
  source              = "../iap"
  project_id          = var.project_id
  region              = var.region
  oauth_client_id     = try(var.iap_oauth_client.id, null)
  oauth_client_secret = try(var.iap_oauth_client.secret, null)
  labels              = var.labels
  services = {
    for n, f in local.iap_functions : n => {
      service  = f.deploy_name
      hostname = local.hostnames[n]
      members  = var.iap_members
    }
  }
  depends_on = [module.project]
}

# --- identities that call the functions ----------------------------------------------------------
resource "google_service_account" "push" {
  project      = var.project_id
  account_id   = "stasis-pubsub-push"
  display_name = "Stasis Pub/Sub push"
  description  = "Identity of the Pub/Sub pushes (and Eventarc triggers) to the event functions."
  depends_on   = [module.project]
}

resource "google_service_account" "scheduler" {
  project      = var.project_id
  account_id   = "stasis-scheduler"
  display_name = "Stasis scheduler"
  description  = "Identity of the Cloud Scheduler jobs calling the periodic functions."
  depends_on   = [module.project]
}

resource "google_service_account" "ide_proxy" {
  project      = var.project_id
  account_id   = "stasis-ide-proxy"
  display_name = "Stasis IDE access proxy"
  description  = "Workload Identity of the IDE access proxy: reads workspaces and teams, publishes resumes."
  depends_on   = [module.project]
}

# The IDE access proxy's front: GKE's Gateway (modules/kubernetes' objects) builds the load
# balancer on this address with this Google-managed certificate, IAP on its backend.
resource "google_compute_global_address" "ide" {
  project = var.project_id
  name    = "${var.name_prefix}-ide"
  labels  = var.labels
}

resource "google_compute_managed_ssl_certificate" "ide" {
  project = var.project_id
  name    = "${var.name_prefix}-ide-${substr(sha256(local.ide_hostname), 0, 8)}"

  managed {
    domains = [local.ide_hostname]
  }
  lifecycle {
    create_before_destroy = true
  }
}

resource "google_service_account" "monitor" {
  project      = var.project_id
  account_id   = "stasis-monitor"
  display_name = "Stasis cluster monitor"
  description  = "Workload Identity of the cluster monitor: publishes workspace and snapshot events."
  depends_on   = [module.project]
}

module "functions" {
  source         = "../functions"
  project_id     = var.project_id
  region         = var.region
  functions      = local.functions
  source_bucket  = module.storage.source_bucket
  source_archive = var.source_archive
  source_sha256  = var.source_sha256
  defaults       = var.function_defaults
  overrides      = var.function_overrides
  labels         = var.labels
  min_instances = merge(
    { for n in local.public_functions : n => var.chat_min_instances if can(regex("slack|chat", n)) },
    var.min_instances,
  )
  environment = merge({
    GOOGLE_CLOUD_PROJECT          = var.project_id
    STASIS_PROJECT                = var.project_id
    STASIS_SNAPSHOT_BUCKET        = module.storage.snapshot_bucket
    STASIS_RUNTIME                = var.runtime
    STASIS_IDENTITY               = "iap"
    STASIS_PLATFORM_ADMINS        = join(",", var.platform_admins)
    STASIS_SLACK_TEAM_ID          = var.slack.team_id
    STASIS_SLACK_ENTERPRISE_ID    = var.slack.enterprise_id
    STASIS_DASHBOARD_EMAIL_DOMAIN = var.dashboard_email_domain
    STASIS_PROXY_URL              = lookup(module.iap.urls, "proxy", "")
    STASIS_IDE_PROXY_URL          = "https://${local.ide_hostname}"
    STASIS_K8S_HOST               = "https://${module.gke.dns_endpoint}"
    STASIS_K8S_CLUSTER            = module.gke.cluster_id
    STASIS_K8S_AGENT_IMAGE        = var.agent_image
    STASIS_K8S_POD_SNAPSHOTS      = var.pod_snapshots ? "1" : "0"
    STASIS_K8S_KUEUE              = var.kueue ? "1" : "0"
    STASIS_K8S_KUEUE_PROVISIONING = var.kueue && var.kueue_provisioning ? "1" : "0"
    STASIS_K8S_FUNCTION_CIDRS     = var.network.subnet_cidr
    # The workspace identity on GKE: the kernels reach workspace_api with their own KSA's
    # projected token (audience stasis-workspace), which it verifies against the cluster's
    # OIDC issuer and its JWKS (<issuer>/jwks). The URL is Cloud Run's deterministic one
    # (the module's output would be a cycle).
    STASIS_WORKSPACE_ISSUER       = "https://container.googleapis.com/v1/${module.gke.cluster_id}"
    STASIS_K8S_WORKSPACE_AUDIENCE = "stasis-workspace"
    STASIS_K8S_WORKSPACE_API_URL  = "https://${var.http_functions["workspace_api"].deploy_name}-${module.project.project_number}.${var.region}.run.app"
  }, var.extra_environment)
  function_environment = {
    for n, audience in module.iap.audiences : n => { STASIS_IAP_AUDIENCE = audience }
  }
  secret_environment = {
    for env, s in var.secrets : env => {
      secret_id = module.secrets.secret_ids[env]
      functions = local.secret_consumers[env]
    }
  }
  vpc = {
    network    = module.network.network_id
    subnetwork = module.network.subnet_id
  }
  vpc_functions = var.runtime == "kubernetes" ? local.cluster_users : []
  invokers = merge(
    { for n, f in local.functions : n => ["serviceAccount:${google_service_account.push.email}"] if f.access == "event" },
    { for n in keys(local.schedules) : n => ["serviceAccount:${google_service_account.scheduler.email}"] },
    { for n in keys(local.iap_functions) : n => ["serviceAccount:${module.project.agents.iap}"] },
    { for n in local.public_functions : n => ["allUsers"] },
  )
  trigger_mode            = var.trigger_mode
  topic_ids               = module.pubsub.topic_ids
  dead_letter_topic_ids   = module.pubsub.dead_letter_topic_ids
  trigger_service_account = google_service_account.push.email
  max_delivery_attempts   = var.max_delivery_attempts
  pubsub_agent            = module.project.agents.pubsub
  artifact_kms_key        = module.kms.key_ids["artifacts"]
  ready                   = concat(module.kms.ready, module.secrets.ready)
  depends_on              = [module.project]
}

module "pubsub" {
  source                = "../pubsub"
  project_id            = var.project_id
  event_topics          = var.event_topics
  event_functions       = var.event_functions
  raw_topics            = distinct([for f in var.event_functions : f.topic if f.event == null])
  trigger_mode          = var.trigger_mode
  push_endpoints        = { for n in keys(var.event_functions) : n => module.functions.uris[n] }
  push_service_account  = google_service_account.push.email
  pubsub_agent          = module.project.agents.pubsub
  max_delivery_attempts = var.max_delivery_attempts
  ack_deadline_seconds  = min(600, max(var.function_defaults.timeout, 10))
  kms_key               = module.kms.key_ids["pubsub"]
  message_regions       = [var.region]
  labels                = var.labels
  dead_letter_readers   = var.dead_letter_readers

  # Each event topic: the identities of the components that emit it (event_publishers).
  publishers             = local.topic_publishers
  dead_letter_publishers = { for n in keys(var.event_functions) : n => local.member[n] }
  depends_on             = [module.project]
}

module "monitoring" {
  source           = "../monitoring"
  project_id       = var.project_id
  project_number   = module.project.project_number
  monitoring       = var.monitoring
  topic_id         = module.pubsub.raw_topic_ids[var.monitoring.topic]
  cluster_name     = var.cluster_name
  gpu_memory_ratio = var.gpu_memory_ratio
  labels           = var.labels
  # The webhook relays what Alertmanager sends; operators may replay a notification.
  publishers = concat(
    [for n in local.public_functions : local.member[n] if can(regex("alertmanager", n))],
    var.publishers,
  )
  depends_on = [module.project]
}

module "scheduler" {
  source          = "../scheduler"
  project_id      = var.project_id
  region          = var.region
  service_account = google_service_account.scheduler.email
  time_zone       = var.scheduler_time_zone
  paused          = var.scheduler_paused
  jobs = {
    for n, cron in local.schedules : n => { schedule = cron, uri = module.functions.uris[n] }
  }
  depends_on = [module.project]
}

module "kubernetes" {
  source                = "../kubernetes"
  count                 = var.manage_kubernetes && var.runtime == "kubernetes" ? 1 : 0
  manifests             = var.kubernetes.manifests
  kueue                 = var.kueue
  control_plane_members = [for n in local.cluster_managers : module.functions.service_accounts[n]]
  reader_members        = [for n in local.cluster_readers : module.functions.service_accounts[n]]
  replacements = {
    "@@PROJECT@@"      = var.project_id
    "@@BUCKET@@"       = module.storage.snapshot_bucket
    "@@AGENT_IMAGE@@"  = var.agent_image
    "@@MONITOR_GSA@@"  = google_service_account.monitor.email
    "@@DISK_KMS_KEY@@" = module.kms.key_ids["disks"]
    # The IDE access proxy (functions/ideproxy) behind IAP.
    "@@IDE_HOST@@"            = local.ide_hostname
    "@@IDE_ADDRESS@@"         = google_compute_global_address.ide.name
    "@@IDE_CERTIFICATE@@"     = google_compute_managed_ssl_certificate.ide.name
    "@@IDE_OAUTH_CLIENT_ID@@" = try(var.iap_oauth_client.id, "")
    "@@IDE_IAP_AUDIENCE@@"    = var.ide_iap_audience
    "@@IDE_GSA@@"             = google_service_account.ide_proxy.email
    "@@EMAIL_DOMAIN@@"        = var.dashboard_email_domain
  }
  ide_oauth_secret = {
    namespace = var.kubernetes.ide_proxy.namespace
    name      = var.kubernetes.ide_proxy.oauth_secret
    key       = var.kubernetes.ide_proxy.oauth_secret_key
    value     = try(var.iap_oauth_client.secret, "")
  }
  depends_on = [module.gke]
}
