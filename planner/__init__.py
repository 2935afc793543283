"""twinfer planner package."""
