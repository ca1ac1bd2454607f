"""The Stasis control plane: small, stateless, idempotent functions driven by events."""
