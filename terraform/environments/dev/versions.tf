terraform {
  required_version = ">= 1.6"

  required_providers {
    google = {
      source  = "hashicorp/google"
      version = ">= 7.33, < 8.0"
    }
    google-beta = {
      source  = "hashicorp/google-beta"
      version = ">= 7.33, < 8.0"
    }
    kubernetes = {
      source  = "hashicorp/kubernetes"
      version = ">= 2.36, < 3.0"
    }
  }

  # State in a bucket of your own (versioned, uniform access), given at init:
  #   terraform init -backend-config="bucket=<state bucket>" -backend-config="prefix=stasis/dev"
  backend "gcs" {}
}
