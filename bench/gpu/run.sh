#!/usr/bin/env bash
# On the device machine (see bench/gpu_validate.py): install the carried wheels, then validate.
set -uo pipefail
cd "$(dirname "$0")/../.."
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .gpu/whl/*.whl || exit 1
# /tmp/site/bin: the carried wheels' executables (ninja, if carried: torch's JIT build of DeepSpeed's
# CPU Adam for the ZeRO-Offload run needs it, with g++ and Python's headers; gpu_validate says which is missing)
export PATH=/tmp/site/bin:$PATH PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1
command -v ninja g++ >/dev/null || echo "no ninja or g++ here: the ZeRO-Offload run cannot build CPU Adam"
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv
python3 -m bench.gpu_validate --data .gpu/data --out "${OUT:-/tmp/bloomline-gpu}" "$@" 2>&1 | tee "${OUT:-/tmp/bloomline-gpu}/log.txt"
# FlexAttention against the dense reference, gradients included (skipped on CPU: no CPU backward)
python3 -m pytest -q -p no:cacheprovider tests/training/model/test_attention.py 2>&1 | tail -5 | tee -a "${OUT:-/tmp/bloomline-gpu}/log.txt"
# The evaluation on the GPU: device=cuda, bf16; validation tokens/s, greedy with and without the
# KV cache, one lm-eval family against lm_eval --model hf when lm-eval is carried (bench/gpu_eval.py)
python3 -m bench.gpu_eval --data .gpu/data --out "${OUT:-/tmp/bloomline-gpu}" 2>&1 | grep -v -i "warn" | tee -a "${OUT:-/tmp/bloomline-gpu}/log.txt"
