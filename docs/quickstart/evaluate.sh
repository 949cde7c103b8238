#!/usr/bin/env bash
# Quick start: evaluate a published BLOOM per language on my text.
#
#   docs/quickstart/evaluate.sh MODEL TEXT OUT [-o key=value ...]
#
# MODEL  a Hugging Face BLOOM folder of any size (config.json, safetensors, tokenizer.json).
# TEXT   held-out text (JSONL / Parquet files or folders, local or at a URL), any languages.
# OUT    the results: OUT/eval/results (a table pandas and DuckDB read), OUT/dashboard/index.html.
#
# On a GPU the model runs there in bf16; a model too big for one GPU spreads over several with
# -o parallel.tp=2 (and parallel.pp); tasks beyond bits per byte: -o 'tasks=[{name: xnli, data: DIR}]'
# (docs/evaluate.md).
set -euo pipefail
usage="usage: evaluate.sh MODEL TEXT OUT [-o key=value ...]"
model=${1:?$usage}
text=${2:?$usage}
out=${3:?$usage}
shift 3

bloomline evaluate --model "$model" --text "$text" --out "$out" "$@"
