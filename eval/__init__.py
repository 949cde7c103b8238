"""Per-language evaluation after each checkpoint, in one process or on tp·pp ranks, its results table (contract 3) and the pages that show it."""
