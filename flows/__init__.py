"""Orchestration only: the Prefect flows of the stages, the processes they run as, the server and the ``bloomline`` command line (rooms: bloomline/imports.py ``ROOMS``).

Importing this package installs secret masking on the loggers of the process (bloomline/secrets.py):
the CLI, a flow run that ``bloomline serve`` starts in a fresh process, the evaluation watcher,
each imports it before it logs."""

from bloomline.secrets import install_log_masking

install_log_masking()
