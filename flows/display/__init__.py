"""What the user sees of a job while and after it runs: progress bars and training's live line
(progress.py), and the summaries printed and published as Prefect artifacts at the end
(summary.py). It reads results; it starts nothing."""
