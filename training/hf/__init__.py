"""Hugging Face in and out: a BLOOM folder's weights into a run (from_hf.py, ``train.init_from``
and evaluation of a published model), a checkpoint of any layout out as a transformers folder
(to_hf.py, ``bloomline export``), and the one map between the two sets of parameter names
(names.py) that both directions read."""
