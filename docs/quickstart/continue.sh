#!/usr/bin/env bash
# Quick start: continue a published BLOOM on my languages, then compare it with the original.
#
#   GPUS=2 docs/quickstart/continue.sh MODEL CORPUS HELDOUT OUT [-o section.key=value ...]
#
# MODEL    a Hugging Face BLOOM folder (config.json, safetensors, tokenizer.json): bloom-560m as
#          configs/pipeline/adapt.yaml has it; another size: -o train.recipe=configs/train/bloom-1b7.yaml
#          (recipes for bloom-1b1, 1b7, 3b and 7b1 on 1-4 GPUs, docs/adapt.md).
# CORPUS   the text to train on (JSONL / Parquet files or folders, local or at a URL).
# HELDOUT  text kept apart: in the new languages, and in languages the model knew, to see what
#          it forgets.
# OUT      where everything goes: OUT/run (the run, its dashboard and export), OUT/base and
#          OUT/continued (evaluations on HELDOUT), OUT/compare.html.
# GPUS     data-parallel ranks, one per GPU (default 1); `bloomline plan --config
#          configs/pipeline/adapt.yaml --gpu a10-24gb` says whether a card holds them.
set -euo pipefail
usage="usage: continue.sh MODEL CORPUS HELDOUT OUT [-o section.key=value ...]"
model=${1:?$usage}
corpus=${2:?$usage}
heldout=${3:?$usage}
out=${4:?$usage}
shift 4
repo=$(cd "$(dirname "$0")/../.." && pwd)

# 1. BLOOM's tokenizer grown on the corpus, training from the model's weights (each checkpoint
#    evaluated per language beside it: the run's dashboard shows each language's change from the
#    original), and the final checkpoint exported as a Hugging Face folder
bloomline pipeline --config "$repo/configs/pipeline/adapt.yaml" --out "$out/run" \
  -o "data.tokenizer.model=$model" -o "train.train.init_from=$model" -o "data.sources=[{path: '$corpus'}]" \
  -o "train.parallel.dp=${GPUS:-1}" "$@"
exported=$(python -c 'import json, sys; print(json.load(open(sys.argv[1]))["outputs"]["export"])' "$out/run/pipeline.json")

# 2. the original and the continued model on the held-out text, each cut by its own tokenizer
bloomline evaluate --model "$model" --text "$heldout" --out "$out/base"
bloomline evaluate --model "$exported" --text "$heldout" --out "$out/continued"

# 3. side by side, per language: bits per byte and task scores, and the change from the original
bloomline dashboard "$out/base" "$out/continued" --out "$out/compare.html"
