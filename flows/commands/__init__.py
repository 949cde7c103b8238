"""The commands of ``bloomline`` (assembled into one app by flows/cli.py): the jobs that run a flow
on a folder (jobs.py), the tools around them (tools.py), and what every command shares (base.py)."""
