"""twinfer ui package."""
