"""Benchmark of the two attention kernels (run by hand; prints figures).

    python -m bench.attention [--workdir /tmp/bloomline-attn-bench] [--repeats 5]

One transformer block (``training.model.bloom.Block``) at bloom-tiny's width (64, 4 heads) and at
bloom-560m's (1024, 16 heads), on micro-batches of 4096 tokens drawn from shards packed from
../shared/corpus at seq 512 and 2048: once as bloomline packs them and once packed loosely
(``pack.max_open_samples=1``: fewer, longer documents per sample; measured: 1.9 and 5.0 documents
per sample at 512 and 2048, against 1.4 and 8.5), to show where each kernel wins; and packed one
document per sample (``1-doc``: documents longer than half the sequence, each alone in its row
and padded, as a one-document-per-sample packer would bucket them).

For each: the block's forward time with ``sdpa`` (dense ALiBi + document bias) and with ``flex``
(FlexAttention, block-sparse; compiled, the compile excluded and reported), the share of
attention tiles the block mask skips, the dense bias's size (what ``sdpa`` materialises per
layer), and the peak memory of one forward of each (``peak_mib``). The training step (forward + backward) is timed for ``sdpa`` only: torch 2.13 has no
FlexAttention backward on CPU. Ratios are from one run, same batches.
"""

from __future__ import annotations

import argparse
import dataclasses
import statistics
import time
from pathlib import Path

import torch

from bench.repo import SHARED
from bench.train_throughput import prepare
from training.config import ModelConfig

WIDTHS = {"tiny": dict(hidden_size=64, num_heads=4), "560m-wide": dict(hidden_size=1024, num_heads=16)}
TOKENS = 4096


def packed_and_loose(workdir: Path) -> tuple[Path, Path]:
    """Shards of ../shared/corpus in buckets 256…2048: as bloomline packs them, and loosely
    (``pack.max_open_samples=1``, the same tokenizer); prepared once per workdir."""
    packed = prepare(workdir, "packed", ["pack.buckets=[256,512,1024,2048]"])
    tok = str(packed / "tokenizer" / "tokenizer.model")
    return packed, prepare(
        workdir, "loose", ["pack.buckets=[256,512,1024,2048]", "pack.max_open_samples=1", f"tokenizer.model={tok}"]
    )


def micro_batches(data: Path, seq: int, n: int) -> list[torch.Tensor]:
    """segment_ids of ``n`` micro-batches of TOKENS tokens from the ``seq`` bucket."""
    from training.data.shard_reader import ShardIndex, collate

    index = ShardIndex(data, "train")
    refs = [
        (sid, row) for sid, s in enumerate(index.shards) if int(s["bucket"]) == seq for row in range(int(s["rows"]))
    ]
    b = max(TOKENS // seq, 1)
    if len(refs) < n * b:
        raise SystemExit(f"{data}: only {len(refs)} samples in the {seq} bucket")
    step = len(refs) // (n * b)
    picked = refs[::step][: n * b]
    return [collate(index, picked[i * b : (i + 1) * b], seq, index.pad_id)["segment_ids"] for i in range(n)]


def peak_mib(fn) -> float:
    """Peak memory ``fn`` allocates beyond what is allocated when it starts, MiB: on GPU torch's
    peak allocation; on CPU the running sum of the allocations and frees torch's profiler
    records (``profile_memory``: each op's own allocations, and the frees), at its maximum. An
    allocator-level figure: RSS would hide memory the allocator reuses from earlier calls."""
    if torch.cuda.is_available():
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
        base = torch.cuda.memory_allocated()
        fn()
        torch.cuda.synchronize()
        return (torch.cuda.max_memory_allocated() - base) / 2**20
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
        fn()
    points = sorted(
        (e.time_range.start, e.cpu_memory_usage if e.name == "[memory]" else e.self_cpu_memory_usage)
        for e in prof.events()
    )
    run = peak = 0
    for _, v in points:
        run += v
        peak = max(peak, run)
    return peak / 2**20


def one_doc_batches(data: Path, seq: int, n: int) -> list[torch.Tensor]:
    """segment_ids of ``n`` micro-batches packed one document per sample: documents of the shards
    that fill more than half of ``seq`` (a one-document packer would put them in this bucket),
    each alone in its row, padded to ``seq``."""
    from training.data.shard_reader import ShardIndex

    index = ShardIndex(data, "train")
    b = max(TOKENS // seq, 1)
    docs = []
    for sid, s in enumerate(index.shards):
        for row in range(int(s["rows"])):
            toks, offsets = index.fetch(sid, row)
            bounds = [*offsets.tolist(), len(toks)]
            docs += [e - a for a, e in zip(bounds, bounds[1:]) if seq // 2 < e - a <= seq]
            if len(docs) >= n * b:
                break
        if len(docs) >= n * b:
            break
    if len(docs) < n * b:
        raise SystemExit(f"{data}: only {len(docs)} documents of {seq // 2 + 1}..{seq} tokens")
    out = []
    for i in range(n):
        seg = torch.zeros(b, seq, dtype=torch.long)
        for r, d in enumerate(docs[i * b : (i + 1) * b]):
            seg[r, :d] = 1
        out.append(seg)
    return out


def timed(fn, repeats: int) -> float:
    fn()
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--workdir", type=Path, default=Path("/tmp/bloomline-attn-bench"))
    ap.add_argument("--repeats", type=int, default=5)
    args = ap.parse_args()
    if not SHARED.is_dir():
        raise SystemExit(f"{SHARED} not found")
    from training.model.attention import document_block_mask
    from training.model.bloom import Block

    args.workdir.mkdir(parents=True, exist_ok=True)
    print(f"threads: {torch.get_num_threads()}; block forward, bf16, micro-batches of {TOKENS} tokens")
    packed, loose = packed_and_loose(args.workdir)
    for seq in (512, 2048):
        for packing, data in (("packed", packed), ("loose", loose), ("1-doc", loose)):
            segs = one_doc_batches(data, seq, 3) if packing == "1-doc" else micro_batches(data, seq, 3)
            docs = [float((s.max(dim=1).values.float()).mean()) for s in segs]
            skipped = statistics.mean(float(document_block_mask(s).sparsity()) for s in segs)
            for width, dims in WIDTHS.items():
                cfg = ModelConfig(vocab_size=8000, num_layers=1, seq_len=2048, **dims)
                torch.manual_seed(0)
                blocks = {k: Block(dataclasses.replace(cfg, attention=k)).to(torch.bfloat16) for k in ("sdpa", "flex")}
                blocks["flex"].load_state_dict(blocks["sdpa"].state_dict())
                xs = [torch.randn(s.shape[0], seq, cfg.hidden_size, dtype=torch.bfloat16) for s in segs]
                with torch.no_grad():
                    t0 = time.perf_counter()
                    blocks["flex"]((xs[0], segs[0]))  # compile for this shape
                    compile_s = time.perf_counter() - t0
                    fwd = {
                        k: timed(lambda b=b: [b((x, s)) for x, s in zip(xs, segs)], args.repeats) / len(segs)
                        for k, b in blocks.items()
                    }
                x_train = [x.clone().requires_grad_() for x in xs]
                train_sdpa = timed(
                    lambda: [
                        blocks["sdpa"]((x, s))[0].float().square().mean().backward() for x, s in zip(x_train, segs)
                    ],
                    max(args.repeats // 2, 1),
                ) / len(segs)
                bias_mib = segs[0].shape[0] * cfg.num_heads * seq * seq * 2 / 2**20
                with torch.no_grad():
                    mem = {k: peak_mib(lambda b=b: b((xs[0], segs[0]))) for k, b in blocks.items()}
                print(
                    f"seq {seq:4d} {packing:6s} ({docs[0]:.1f} docs/sample, {skipped:.0f}% tiles skipped) {width:9s}: "
                    f"forward sdpa {fwd['sdpa'] * 1e3:7.1f} ms, flex {fwd['flex'] * 1e3:7.1f} ms "
                    f"(×{fwd['sdpa'] / fwd['flex']:.2f}; compile {compile_s:.0f} s); "
                    f"train step sdpa {train_sdpa * 1e3:7.1f} ms; dense bias {bias_mib:,.0f} MiB per layer; "
                    f"forward peak memory sdpa {mem['sdpa']:,.0f} MiB, flex {mem['flex']:,.0f} MiB"
                )


if __name__ == "__main__":
    main()
