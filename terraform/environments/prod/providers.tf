provider "google" {
  project = var.project_id
  region  = var.region
}

provider "google-beta" {
  project = var.project_id
  region  = var.region
}

data "google_client_config" "this" {}

# The cluster's control plane is reached through its DNS endpoint with the caller's Google
# token (no IP endpoint, no client certificate; the endpoint's certificate is public).
provider "kubernetes" {
  host  = "https://${module.stasis.cluster_dns_endpoint}"
  token = data.google_client_config.this.access_token
}
