"""What a notebook imports: ``import stasis.jobs`` (scale-out jobs from a workspace)."""
