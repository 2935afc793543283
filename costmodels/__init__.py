"""twinfer costmodels package."""
