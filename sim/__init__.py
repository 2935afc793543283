"""twinfer sim package."""
