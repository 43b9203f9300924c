"""trace layer."""
