"""The command line, the top room of flows/: ``bloomline``'s commands in one Typer app (app.py),
the jobs that run a flow on a folder (jobs.py), the tools around them (tools.py: export,
dashboard, filters, plan, serve), what every command shares (base.py: one-line errors, exit
status 2, the folder held), and the pages it prints or writes (layout_plan.py, the configuration
reference config_reference.py). Nothing below imports it."""
