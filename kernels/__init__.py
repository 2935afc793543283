"""twinfer kernels package."""
