"""The parallel evaluator: a checkpoint of any layout evaluated on tp·pp ranks, each holding one
pipeline stage's tensor-parallel slice (stage.py), driven by rank 0, which runs the very tasks of
the single-process evaluation through :class:`~eval.model.EvalModel` (ranks.py); started and
ended like training's ranks (launch.py, main.py)."""
