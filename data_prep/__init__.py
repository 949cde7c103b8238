"""Data preparation: raw multilingual corpora → length-bucketed Arrow shards + manifest
(``data_prep/FORMAT.md``, contract 1).

Rooms, lowest first (bloomline/imports.py ``ROOMS``): ``config`` (the recipe), ``steps/`` (what is
done to each document), ``inputs/`` (reading), ``storage/`` (what a run writes), ``reports/``,
``calibration/`` (the shipped thresholds), ``passes/`` and ``dedup/`` (the passes over the run
folder), ``pipeline`` (the driver, and the table of passes in the order it runs them).
"""
