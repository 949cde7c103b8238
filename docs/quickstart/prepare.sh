#!/usr/bin/env bash
# Quick start: prepare my corpus for training.
#
#   docs/quickstart/prepare.sh CORPUS OUT [-o key=value ...]
#
# CORPUS  JSONL or Parquet files, or folders of them, local or at a URL (s3://, gs://, hf://): one
#         record per document, {"text": "...", "lang": "tr"}; "lang" is any ISO 639 code, with a
#         script where it matters ("sr-Cyrl"); a record without one is labelled by language ID.
# OUT     the prepared data: shards, tokenizer, manifest.json (local or at a URL).
#
# BLOOM's settings (configs/data/bloom.yaml): its tokenizer's kind and size, samples of up to
# 2,048 tokens, ROOTS' quality thresholds. To keep a published BLOOM's own tokenizer, add
# -o tokenizer.model=MODEL_FOLDER. Rerun the same command after a stop: it resumes.
#
# Thresholds fitted to your languages: derive them from text you know is clean (records with
# "text", "lang" and, where known, "source"; the report of what each source would lose under
# thresholds derived from the others goes to stderr), then give them to this script:
#   bloomline filters --derive CLEAN_TEXT > thresholds.yaml
#   docs/quickstart/prepare.sh CORPUS OUT -o filters.languages=@thresholds.yaml
set -euo pipefail
usage="usage: prepare.sh CORPUS OUT [-o key=value ...]"
corpus=${1:?$usage}
out=${2:?$usage}
shift 2
repo=$(cd "$(dirname "$0")/../.." && pwd)

bloomline prepare --config "$repo/configs/data/bloom.yaml" --out "$out" "$corpus" "$@"
# what was dropped per language and why, with an example of each
bloomline filters "$out" --examples 1
