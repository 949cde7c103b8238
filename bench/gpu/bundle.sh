#!/usr/bin/env bash
# Build .gpu/ (git-ignored) for bench/gpu_validate.py on the device machine, which has torch,
# pyarrow, sentencepiece, tensorboard and yaml but not DeepSpeed or megatron-core, runs Python
# 3.12 and cannot reach the network. Run here, from the repository root, with .venv active.
set -euo pipefail
cd "$(dirname "$0")/../.."
mkdir -p .gpu/whl
PLAT=(--only-binary=:all: --python-version 3.12 --implementation cp --platform manylinux_2_28_x86_64
      --platform manylinux_2_27_x86_64 --platform manylinux_2_24_x86_64 --platform manylinux_2_17_x86_64
      --platform manylinux2014_x86_64 --platform any)
# DeepSpeed is an sdist on PyPI: build its pure-Python wheel once (ops are JIT-built, we use none).
pip wheel -q --no-deps --no-build-isolation -w .gpu/whl "deepspeed==$(python -c 'import importlib.metadata as m; print(m.version("deepspeed"))')"
pip download -q --no-deps "${PLAT[@]}" -d .gpu/whl \
    "megatron-core==$(python -c 'import importlib.metadata as m; print(m.version("megatron-core"))')" \
    "pydantic==$(python -c 'import pydantic; print(pydantic.VERSION)')" hjson annotated-types typing-inspection \
    pytest pluggy iniconfig packaging pygments \
    ninja  # run.sh runs the attention tests there too; ninja: torch's JIT build of CPU Adam (ZeRO-Offload)
# pydantic pins its core exactly
CORE=$(unzip -p .gpu/whl/pydantic-*.whl '*/METADATA' | sed -n 's/^Requires-Dist: pydantic-core==\([0-9.]*\).*/\1/p')
pip download -q --no-deps "${PLAT[@]}" -d .gpu/whl "pydantic-core==$CORE"
# Shards: ../shared/corpus when present (real text, 59 languages), else the bundled sample corpus.
if [ ! -f .gpu/data/manifest.json ]; then
  SRC=../shared/corpus; [ -d "$SRC" ] || SRC=data_prep/sample_corpus
  python -m flows.cli.app prepare --out .gpu/data "$SRC" --config configs/data/demo.yaml \
      -o tokenizer.vocab_size=8000 -o "pack.buckets=[256,512,1024,2048]" -o pack.valid_fraction=0.01
fi
du -sh .gpu/whl .gpu/data
