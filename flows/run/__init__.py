"""How a job runs as processes, the lowest room of flows/ above the recipe (config.py): flow
parameters without secrets (params.py), every process ending with its driver (lifeline.py), Ctrl-C
and SIGTERM (interrupt.py), the evaluation's CPU share (pace.py), one owner per folder
(runlock.py), the Prefect server a command reports to (api_server.py) and what ``bloomline serve``
keeps and allows (serve_state.py, served.py), the Dask cluster (dask_cluster.py), and user errors
without Prefect's tracebacks (user_errors.py). No flow, command or page lives here."""
