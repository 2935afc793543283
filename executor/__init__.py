"""twinfer executor package."""
