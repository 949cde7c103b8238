"""The passes of ``bloomline prepare`` over its output folder (data_prep/pipeline.py runs them in order):
chunks, tokenizer, pack, manifest, with what they share (memory budget, α-sampling, the validation
split, best-fit packing). The dedup pass has its own folder (data_prep/dedup/)."""
