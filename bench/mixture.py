"""Benchmark of the online language mixture against fixed blends (run by hand; prints figures).

    python -m bench.mixture [--steps 300] [--seeds 3] [--workdir /tmp/bloomline-mixture]
    python -m bench.mixture --corpus skewed [--steps 300] [--seeds 3] [--arms natural,alpha,...]

bloom-tiny trains on ../shared/corpus (all 59 languages, prepared with configs/data/demo.yaml's
settings) to the same number of steps of the same token budget in five arms:

* ``alpha``: fixed, BLOOM's α-sampling (the manifest's blend, p ∝ tokens^0.3);
* ``uniform``: fixed, every language alike (the same shards, a manifest blend of equal weights);
* ``bandit``: online, exponential weights on each language's smoothed training loss (ODM);
* ``evaluation``: online, each checkpoint's held-out bpb progress per doubling of tokens seen,
  from the evaluations that run beside training (``bloomline train``'s watcher, here at normal
  priority: on 2 busy cores an idle-priority evaluation would land only after training ends);
* ``excess``: online, the same rule with a reference run (DoReMi's excess bpb over the reference
  at equal tokens of each language seen). The reference is trained once, like ``alpha`` with
  seed 0 (no arm's seed) and evaluated at every checkpoint (``runs/reference-seed0``).

Each arm runs with every seed (the seed moves the initial weights and the sampler). The final
checkpoint of every run is evaluated alike (fp32, the data's validation split), and the report
gives per arm, as mean ± standard deviation over the seeds: the mean of the languages' bpb, its
median, the mean of the worst 5, the mean per family (niger-congo, indic, code, other), the
tokens trained, and the final weights (the most and least weighted languages).

Caveats printed with the table: the final bpb is measured on the same validation split the
evaluation arm steers by (its only use of it: the per-language progress); and the corpus is
nearly balanced (102-250 KB per language), so α-sampling is close to uniform here. A run whose
folder already holds its final evaluation is not run again (``--fresh`` to redo).

With ``--corpus skewed``, the verdict on a corpus skewed as ROOTS was (bench/mixture_skewed.py).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
from pathlib import Path

from bench.mixture_arms import ARMS, FAMILIES, run_arm
from bench.mixture_skewed import skewed
from bench.repo import REPO, SHARED, cli

REFERENCE_SEED = 0


def prepare(wd: Path) -> tuple[Path, Path]:
    """The corpus prepared once (α blend), and a copy whose manifest blends the languages equally
    (the same shards, hard-linked; only the manifest's blend differs)."""
    data = wd / "data"
    if not (data / "manifest.json").exists():
        print(f"preparing {SHARED} → {data} …", flush=True)
        cli(
            "prepare",
            "--config",
            str(REPO / "configs/data/demo.yaml"),
            "--out",
            str(data),
            str(SHARED),
            log=wd / "prepare.log",
            DS_ACCELERATOR="cpu",
        )
    uniform = wd / "data-uniform"
    if not (uniform / "manifest.json").exists():
        shutil.rmtree(uniform, ignore_errors=True)
        shutil.copytree(data, uniform, copy_function=os.link)
        m = json.loads((data / "manifest.json").read_text())
        m["blend"] = {k: 1.0 / len(m["blend"]) for k in m["blend"]}
        (uniform / "manifest.json").unlink()  # a hard link: write a file of its own
        (uniform / "manifest.json").write_text(json.dumps(m, indent=2, sort_keys=True) + "\n")
    return data, uniform


def final_weights(out: Path, data: Path) -> dict[str, float]:
    from training.checkpoint.run_dir import RunDir
    from training.data.mixture.log import read_log

    moved = [e["weights"] for e in read_log(RunDir(out)) if e["weights"]]
    if moved:
        return moved[-1]
    blend = json.loads((data / "manifest.json").read_text())["blend"]
    total = sum(blend.values())
    return {k: v / total for k, v in blend.items() if v > 0}


def summary(out: Path, steps: int) -> dict[str, float]:
    from eval.results.rows import validation_rows
    from eval.results.table import read_results
    from training.loop.metrics_log import read_metrics

    rows = [r for r in validation_rows(read_results(out)) if r["step"] == steps and r["scope"] == "language"]
    bpb = sorted(r["bpb"] for r in rows)
    s = {"mean": statistics.fmean(bpb), "median": statistics.median(bpb), "worst5": statistics.fmean(bpb[-5:])}
    for fam in FAMILIES:
        s[fam] = statistics.fmean(r["bpb"] for r in rows if r["family"] == fam)
    s["tokens"] = sum(m["global_batch_tokens"] for m in read_metrics(out / "metrics.jsonl")[0])
    return s


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--steps", type=int, default=300)
    ap.add_argument("--seeds", type=int, default=3)
    ap.add_argument("--interval", type=int, help="checkpoints (and evaluations) of the evaluation arms (25; skewed 50)")
    ap.add_argument("--eval-tokens", type=int, help="tokens per language per evaluation (8192; skewed 4096)")
    ap.add_argument("--arms", default=",".join(ARMS))
    ap.add_argument("--workdir", type=Path, help="(/tmp/bloomline-mixture, skewed: /tmp/bloomline-mixture-skewed)")
    ap.add_argument("--fresh", action="store_true")
    ap.add_argument("--corpus", choices=["balanced", "skewed"], default="balanced")
    ap.add_argument("--mb", type=float, default=64, help="skewed: corpus size (tests/support/skewed.py)")
    ap.add_argument("--floor-kb", type=float, default=16, help="skewed: the least of any language")
    ap.add_argument("--test-kb", type=float, default=24, help="skewed: test corpus per language")
    ap.add_argument("--test-items", type=int, default=50, help="skewed: continuation items per language on test")
    ap.add_argument("--tokens-per-step", type=int, default=4096, help="skewed: batch.tokens_per_step")
    ap.add_argument(
        "--extra-arm",
        action="append",
        default=[],
        help="skewed: NAME=ARM:key=value,... another arm, ARM's values and these (a rule's variant)",
    )
    ap.add_argument(
        "--dev",
        action="store_true",
        help="skewed: the development round: seed 0, runs in runs-dev/, judged on the data's validation split",
    )
    a = ap.parse_args()
    sk = a.corpus == "skewed"
    a.interval = a.interval or (50 if sk else 25)
    a.eval_tokens = a.eval_tokens or (4096 if sk else 8192)
    a.workdir = a.workdir or Path("/tmp/bloomline-mixture" + ("-skewed" if sk else ""))
    if sk:
        if a.arms == ",".join(ARMS):
            a.arms = ""
        if a.fresh:
            shutil.rmtree(a.workdir / "runs", ignore_errors=True)
        return skewed(a)
    if a.fresh:
        shutil.rmtree(a.workdir / "runs", ignore_errors=True)
    a.workdir.mkdir(parents=True, exist_ok=True)
    data, uniform = prepare(a.workdir)
    arms = a.arms.split(",")
    reference = None
    if "excess" in arms:  # DoReMi's reference: the baseline mixture's run, evaluated as it trains
        reference = a.workdir / "runs" / f"reference-seed{REFERENCE_SEED}"
        wall = run_arm("reference", REFERENCE_SEED, data, reference, a.steps, a.interval, a.eval_tokens)
        print(
            f"reference (alpha, seed {REFERENCE_SEED}, evaluated every {a.interval} steps)"
            + (f": {wall:.0f} s" if wall else ": done before"),
            flush=True,
        )
    results: dict[str, list[dict[str, float]]] = {}
    weights: dict[str, list[dict[str, float]]] = {}
    for seed in range(1, a.seeds + 1):
        for arm in arms:
            d = uniform if arm == "uniform" else data
            out = a.workdir / "runs" / f"{arm}-seed{seed}"
            wall = run_arm(
                arm, seed, d, out, a.steps, a.interval, a.eval_tokens, reference if arm == "excess" else None
            )
            s = summary(out, a.steps)
            results.setdefault(arm, []).append(s)
            weights.setdefault(arm, []).append(final_weights(out, d))
            print(
                f"{arm:<10} seed {seed}: mean bpb {s['mean']:.4f} | worst5 {s['worst5']:.4f} | tokens {s['tokens']:,}"
                + (f" | {wall:.0f} s" if wall else " | (done before)"),
                flush=True,
            )

    def ms(arm: str, key: str) -> str:
        v = [r[key] for r in results[arm]]
        return f"{statistics.fmean(v):.4f} ± {statistics.stdev(v) if len(v) > 1 else 0:.4f}"

    cols = ["mean", "median", "worst5", *FAMILIES]
    print(
        f"\nheld-out bpb after {a.steps} steps ({results[arms[0]][0]['tokens']:,} tokens), mean ± sd over "
        f"{a.seeds} seeds"
    )
    print("| arm | " + " | ".join(cols) + " |\n|---|" + "---|" * len(cols))
    for arm in arms:
        print(f"| {arm} | " + " | ".join(ms(arm, c) for c in cols) + " |")
    base = statistics.fmean(r["mean"] for r in results[arms[0]])
    for arm in arms[1:]:
        d = statistics.fmean(r["mean"] for r in results[arm]) - base
        print(f"{arm} vs {arms[0]}: mean bpb {d:+.4f} ({d / base:+.2%})")
    print("\nfinal weights (mean over seeds): most and least weighted")
    for arm in arms:
        langs = weights[arm][0]
        mean = {l: statistics.fmean(w[l] for w in weights[arm]) for l in langs}
        order = sorted(mean, key=lambda l: -mean[l])
        print(
            f"  {arm:<10} max {', '.join(f'{l} {mean[l]:.3f}' for l in order[:4])} | "
            f"min {', '.join(f'{l} {mean[l]:.4f}' for l in order[-3:])}"
        )
    (a.workdir / "report.json").write_text(json.dumps({"results": results, "weights": weights}, indent=1))
    print(
        "\ncaveats: the final bpb is read on the validation split the evaluation arm steers by; the corpus's "
        "languages are nearly balanced, so α-sampling is close to uniform here"
    )


if __name__ == "__main__":
    main()
