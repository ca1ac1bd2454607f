# IAP in front of the dashboard, the access proxy and the links API: a global external
# Application Load Balancer with a serverless NEG per function and IAP on each backend.
#
# Why this and not IAP directly on Cloud Run: a 2nd gen function's Cloud Run service is
# owned by Cloud Functions, which does not expose Cloud Run's iap_enabled; the load
# balancer works for any function, gives one certificate for every hostname, and lets the
# functions stay ALLOW_INTERNAL_AND_GCLB (unreachable around IAP). The functions verify the
# IAP JWT with the audience output below (STASIS_IAP_AUDIENCE).

resource "google_compute_global_address" "this" {
  project = var.project_id
  name    = "${var.name}-iap"
  labels  = var.labels
}

resource "google_compute_managed_ssl_certificate" "this" {
  project = var.project_id
  name    = "${var.name}-iap-${substr(sha256(join(",", sort([for s in values(var.services) : s.hostname]))), 0, 8)}"

  managed {
    domains = sort([for s in values(var.services) : s.hostname])
  }
  lifecycle {
    create_before_destroy = true
  }
}

resource "google_compute_ssl_policy" "this" {
  project         = var.project_id
  name            = "${var.name}-iap"
  profile         = "RESTRICTED"
  min_tls_version = var.ssl_policy_min_tls
}

resource "google_compute_region_network_endpoint_group" "this" {
  for_each = var.services

  project               = var.project_id
  name                  = "${var.name}-${replace(each.key, "_", "-")}"
  region                = var.region
  network_endpoint_type = "SERVERLESS"

  cloud_run {
    service = each.value.service
  }
}

resource "google_compute_backend_service" "this" {
  for_each = var.services

  project               = var.project_id
  name                  = "${var.name}-${replace(each.key, "_", "-")}"
  protocol              = "HTTPS"
  load_balancing_scheme = "EXTERNAL_MANAGED"

  backend {
    group = google_compute_region_network_endpoint_group.this[each.key].id
  }

  iap {
    enabled              = true
    oauth2_client_id     = var.oauth_client_id
    oauth2_client_secret = var.oauth_client_secret
  }

  log_config {
    enable      = true
    sample_rate = 1.0
  }
}

resource "google_compute_url_map" "this" {
  project         = var.project_id
  name            = "${var.name}-iap"
  default_service = google_compute_backend_service.this[sort(keys(var.services))[0]].id

  dynamic "host_rule" {
    for_each = var.services
    content {
      hosts        = [host_rule.value.hostname]
      path_matcher = replace(host_rule.key, "_", "-")
    }
  }

  dynamic "path_matcher" {
    for_each = var.services
    content {
      name            = replace(path_matcher.key, "_", "-")
      default_service = google_compute_backend_service.this[path_matcher.key].id
    }
  }
}

resource "google_compute_target_https_proxy" "this" {
  project          = var.project_id
  name             = "${var.name}-iap"
  url_map          = google_compute_url_map.this.id
  ssl_certificates = [google_compute_managed_ssl_certificate.this.id]
  ssl_policy       = google_compute_ssl_policy.this.id
}

resource "google_compute_global_forwarding_rule" "https" {
  project               = var.project_id
  name                  = "${var.name}-iap-https"
  target                = google_compute_target_https_proxy.this.id
  ip_address            = google_compute_global_address.this.address
  port_range            = "443"
  load_balancing_scheme = "EXTERNAL_MANAGED"
  labels                = var.labels
}

# Plain HTTP only redirects to HTTPS.
resource "google_compute_url_map" "redirect" {
  project = var.project_id
  name    = "${var.name}-iap-redirect"

  default_url_redirect {
    https_redirect         = true
    redirect_response_code = "MOVED_PERMANENTLY_DEFAULT"
    strip_query            = false
  }
}

resource "google_compute_target_http_proxy" "redirect" {
  project = var.project_id
  name    = "${var.name}-iap-redirect"
  url_map = google_compute_url_map.redirect.id
}

resource "google_compute_global_forwarding_rule" "http" {
  project               = var.project_id
  name                  = "${var.name}-iap-http"
  target                = google_compute_target_http_proxy.redirect.id
  ip_address            = google_compute_global_address.this.address
  port_range            = "80"
  load_balancing_scheme = "EXTERNAL_MANAGED"
  labels                = var.labels
}

locals {
  accessors = merge([
    for name, s in var.services : {
      for member in s.members : "${name}/${member}" => { service = name, member = member }
    }
  ]...)
}

resource "google_iap_web_backend_service_iam_member" "accessors" {
  for_each = local.accessors

  project             = var.project_id
  web_backend_service = google_compute_backend_service.this[each.value.service].name
  role                = "roles/iap.httpsResourceAccessor"
  member              = each.value.member
}

data "google_project" "this" {
  project_id = var.project_id
}
