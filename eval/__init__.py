"""Per-language evaluation after each checkpoint."""
