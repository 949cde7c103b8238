"""The pages a user opens: one escaped template and its Content-Security-Policy (html.py), a
run's dashboard (dashboard.py) with its task pages (tasks.py) and mixture page (mixture.py), and
runs side by side (compare.py). They read the results table (eval/results/); they compute no
metric of their own."""
