"""The only place SDKs are imported."""
