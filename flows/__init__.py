"""Prefect flows wrapping each stage, and the ``bloomline`` CLI.

Importing this package installs secret masking on the loggers of the process (bloomline/secrets.py):
the CLI, a flow run that ``bloomline serve`` starts in a fresh process, the evaluation watcher,
each imports it before it logs."""

from bloomline.secrets import install_log_masking

install_log_masking()
