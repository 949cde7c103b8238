"""The Prefect flows, one per stage — ``prepare``, ``train`` (with its job outside the flow,
train_job.py, and the evaluation watcher beside its ranks, watch.py), ``evaluate`` — and the main
job ``pipeline`` that chains them, each stage reused by a key of what its output depends on
(reuse.py). Stage logic lives in data_prep/, training/ and eval/; these only orchestrate it."""
