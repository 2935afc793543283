"""twinfer scheduler package."""
