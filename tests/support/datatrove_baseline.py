"""The datatrove baseline of bench/prepare_throughput.py: the same steps as ``bloomline prepare``
(JSONL reader, Gopher-style quality filter, MinHash dedup, tokenization with the same tokenizer)
as a datatrove pipeline (PyPI ``datatrove``; ``pip install -e ".[bench]"``).

    python -m tests.support.datatrove_baseline INPUT_DIR OUT_DIR TOKENIZER_JSON WORKERS

prints one JSON line: seconds, documents read and kept, tokens written. Run as its own process
(datatrove's executors fork workers) and timed from outside by the caller.
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path


def spm_to_tokenizers(model_file: str | Path, out: str | Path) -> Path:
    """The SentencePiece BPE model as a Hugging Face ``tokenizers`` file (what datatrove's
    DocumentTokenizer loads): the same pieces and merges, byte fallback and dummy prefix as the
    model says. The caller checks the ids agree with SentencePiece's."""
    from tokenizers import Tokenizer, normalizers, pre_tokenizers
    from tokenizers.models import BPE
    from transformers.convert_slow_tokenizer import SentencePieceExtractor

    ex = SentencePieceExtractor(str(model_file))
    spec, norm = ex.proto.trainer_spec, ex.proto.normalizer_spec
    if spec.model_type != 2:
        raise ValueError(f"{model_file}: not a BPE model (type {spec.model_type})")
    kw = ex.extract(BPE)
    tok = Tokenizer(BPE(kw["vocab"], kw["merges"], unk_token="<unk>", fuse_unk=True, byte_fallback=spec.byte_fallback))
    steps = [normalizers.Precompiled(norm.precompiled_charsmap)] if norm.precompiled_charsmap else []
    tok.normalizer = normalizers.Sequence([*steps, normalizers.Replace(" ", "▁")])
    tok.pre_tokenizer = pre_tokenizers.Metaspace(
        replacement="▁", split=False, prepend_scheme="first" if norm.add_dummy_prefix else "never"
    )
    out = Path(out)
    tok.save(str(out))
    return out


def run(src: str, out: Path, tokenizer: str, workers: int) -> dict:
    from datatrove.executor import LocalPipelineExecutor
    from datatrove.pipeline.dedup import (
        MinhashDedupBuckets,
        MinhashDedupCluster,
        MinhashDedupFilter,
        MinhashDedupSignature,
    )
    from datatrove.pipeline.dedup.minhash import MinhashConfig
    from datatrove.pipeline.filters import GopherQualityFilter
    from datatrove.pipeline.readers import JsonlReader
    from datatrove.pipeline.tokens import DocumentTokenizer

    # 16 bands x 8 rows = 128 hashes, bloomline's dedup.num_perm; 5-gram shingles as bloomline's.
    cfg = MinhashConfig(n_grams=5, num_buckets=16, hashes_per_bucket=8)
    # min_stop_words off: datatrove's stop-word rule is English-only and would drop most of a
    # multilingual corpus, which bloomline's per-language filter keeps.
    read = lambda: [JsonlReader(src, glob_pattern="*.jsonl"), GopherQualityFilter(min_stop_words=None)]  # noqa: E731
    t0 = time.perf_counter()
    stages = [
        dict(pipeline=[*read(), MinhashDedupSignature(output_folder=str(out / "sigs"), config=cfg)], tasks=workers),
        dict(
            pipeline=[
                MinhashDedupBuckets(input_folder=str(out / "sigs"), output_folder=str(out / "buckets"), config=cfg)
            ],
            tasks=cfg.num_buckets,
        ),
        dict(
            pipeline=[
                MinhashDedupCluster(input_folder=str(out / "buckets"), output_folder=str(out / "remove"), config=cfg)
            ],
            tasks=1,
        ),
        dict(
            pipeline=[
                *read(),
                MinhashDedupFilter(input_folder=str(out / "remove")),
                DocumentTokenizer(
                    output_folder=str(out / "tokens"), tokenizer_name_or_path=tokenizer, eos_token="</s>"
                ),
            ],
            tasks=workers,
        ),
    ]
    stats = []
    for i, st in enumerate(stages):
        ex = LocalPipelineExecutor(**st, workers=min(workers, st["tasks"]), logging_dir=str(out / "logs" / str(i)))
        stats.append(ex.run())
    seconds = time.perf_counter() - t0
    by_name = {s.name: s.stats for s in stats[-1].stats}
    read_docs = next(v for k, v in by_name.items() if "Reader" in k or "READER" in k)
    tok = next(v for k, v in by_name.items() if "TOKENIZER" in k or "Tokeniz" in k)
    dedup = next(v for k, v in by_name.items() if "DEDUP" in k)
    return {
        "seconds": seconds,
        "documents": int(read_docs["documents"].total),
        "kept": int(dedup["forwarded"].total),
        "tokens": int(tok["tokens"].total),
    }


def check_xxhash() -> None:
    """datatrove 0.10.1 hashes ``str`` with xxhash, which xxhash 4 refuses (its MinHash step
    fails with "Strings must be encoded before hashing"): say so before anything runs."""
    from importlib.metadata import version

    if int(version("xxhash").split(".")[0]) >= 4:
        raise SystemExit(
            f"datatrove {version('datatrove')} needs xxhash < 4 (installed: {version('xxhash')}); "
            "for this comparison: pip install 'xxhash<4' (bloomline works with either)"
        )


def run_timed(src: str | Path, out: Path, tokenizer: str | Path, workers: int) -> tuple[float, dict]:
    """Run this baseline as its own process; (seconds of the whole process, what it printed)."""
    import subprocess

    check_xxhash()
    t0 = time.perf_counter()
    res = subprocess.run(
        [sys.executable, __file__, str(src), str(out), str(tokenizer), str(workers)], capture_output=True, text=True
    )
    if res.returncode:
        raise SystemExit(res.stderr[-3000:])
    return time.perf_counter() - t0, json.loads(res.stdout.strip().splitlines()[-1])


if __name__ == "__main__":
    src, out, tokenizer, workers = sys.argv[1], Path(sys.argv[2]), sys.argv[3], int(sys.argv[4])
    print(json.dumps(run(src, out, tokenizer, workers)))
