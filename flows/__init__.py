"""Prefect flows wrapping each stage, and the ``bloomline`` CLI."""
