"""The verdict where a mixture matters: ``python -m bench.mixture --corpus skewed``.

The corpus is tests/support/skewed.py's, grown in ROOTS' proportions (``--mb``, every language at least ``--floor-kb``), prepared with
configs/data/demo.yaml's settings; a **test** corpus of ``--test-kb`` of every language, walked
with another seed and holding no training text, is prepared with the training data's tokenizer,
and the verdict reads it alone (``evaluation.settings.heldout``): the evaluation arms steer by the
data's validation split, never by the test split. Arms (``SKEWED_ARMS``): ``natural``; ``alpha``
(BLOOM's α = 0.3); ``uniform``; ``unimax`` (``max_epochs`` = UNIMAX_EPOCHS); ``schedule``
(τ 5 → 1 over the run, the recipe's defaults); ``bandit``; ``evaluation`` (bpb progress) and
``continuation`` (progress of the continuation task's error rate), the online rules at their
defaults (chosen before any of these runs, as on the balanced corpus). Equal token budgets, every
seed. Reported per arm on the test split, mean ± sd over seeds: mean bpb, worst 5, the tail (the
10 languages with the fewest training tokens), the head (the 5 with the most), the epochs seen
by the tail and the head, and the continuation accuracy per family; then, for each online arm,
the verdict against the best fixed rule (α, UniMax or the schedule) on the tail.
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
from pathlib import Path

from bench.mixture_arms import FAMILIES, run_arm
from bench.repo import REPO, cli

UNIMAX_EPOCHS = 4
"""UniMax's cap for the skewed verdict, written down before any run: within the 1-5 epochs of
Chung et al. 2023 (their Table 3: 1 or 5 at most is best by model size), and above the ~2 the
α blend gives the tail at this budget, so the cap lifts the tail rather than holds it back."""
STEERING_ITEMS = 40
"""Continuation items per language in the continuation arm's evaluations while training."""
SKEWED_ARMS = {
    "natural": ["batch.blend.rule=natural"],
    "alpha": [],  # the manifest's blend: α = 0.3 over the prepared tokens
    "uniform": ["batch.blend.rule=alpha", "batch.blend.alpha=0"],
    "unimax": ["batch.blend.rule=unimax", f"batch.blend.max_epochs={UNIMAX_EPOCHS}"],
    "schedule": ["batch.blend.rule=schedule"],
    "bandit": ["batch.mixture=online", "batch.online.rule=bandit"],
    "evaluation": ["batch.mixture=online", "batch.online.rule=evaluation", "evaluation.settings.tasks=[]"],
    "continuation": [
        "batch.mixture=online",
        "batch.online.rule=evaluation",
        "batch.online.signal=continuation",
        f"evaluation.settings.tasks=[{{name: continuation, limit: {STEERING_ITEMS}}}]",
    ],
}
FIXED = ("alpha", "unimax", "schedule")  # the fixed rules an online rule must beat


def prepare_skewed(wd: Path, mb: float, floor_kb: float, test_kb: float) -> tuple[Path, Path]:
    """The skewed corpus prepared (its tokenizer trained on it), and the test corpus prepared with
    that tokenizer, nearly all of it in its validation split (the split an evaluation reads)."""
    from tests.support.skewed import grow_skewed, grow_test

    corpus, test_corpus = wd / "corpus", wd / "test-corpus"
    grow_skewed(corpus, mb, floor_kb, seed=0)
    t = grow_test(test_corpus, corpus, test_kb, seed=1)
    data, test = wd / "data", wd / "test-data"
    recipe = str(REPO / "configs/data/demo.yaml")
    if not (data / "manifest.json").exists():
        print(f"preparing the skewed corpus {corpus} → {data} …", flush=True)
        cli(
            "prepare", "--config", recipe, "--out", str(data), str(corpus), log=wd / "prepare.log", DS_ACCELERATOR="cpu"
        )
    if not (test / "manifest.json").exists():
        print(
            f"preparing the test corpus ({t.get('dropped_as_seen', 0)} walks dropped as seen in training) …", flush=True
        )
        model = data / json.loads((data / "manifest.json").read_text())["tokenizer"]["path"]
        cli(
            "prepare",
            "--config",
            recipe,
            "--out",
            str(test),
            str(test_corpus),
            "-o",
            f"tokenizer.model={model}",
            "-o",
            "pack.valid_fraction=0.9",
            log=wd / "prepare-test.log",
            DS_ACCELERATOR="cpu",
        )
    return data, test


def sizes(data: Path) -> dict[str, int]:
    """Each language's training tokens in the prepared data."""
    langs = json.loads((data / "manifest.json").read_text())["languages"]
    return {k: int(v["train_tokens"]) for k, v in langs.items()}


def skewed_summary(out: Path, steps: int, tail: list[str], head: list[str], into: str = "test") -> dict[str, float]:
    """An arm's figures (module docstring) from its final checkpoint's evaluation in ``out/<into>``."""
    from eval.results.table import read_results

    rows = [r for r in read_results(out / into).to_pylist() if r["step"] == steps and r["scope"] == "language"]
    val = {r["lang"]: r for r in rows if r["task"] == "validation" and r["metric"] == "bpb"}
    bpb = {k: r["value"] for k, r in val.items()}
    order = sorted(bpb.values())
    s = {
        "mean": statistics.fmean(order),
        "worst5": statistics.fmean(order[-5:]),
        "tail": statistics.fmean(bpb[l] for l in tail),
        "head": statistics.fmean(bpb[l] for l in head),
        "epochs_tail": statistics.fmean(val[l]["epochs_seen"] for l in tail),
        "epochs_head": statistics.fmean(val[l]["epochs_seen"] for l in head),
        "epochs_min": min(r["epochs_seen"] for r in val.values()),
        "epochs_max": max(r["epochs_seen"] for r in val.values()),
    }
    acc = [r for r in rows if r["task"] == "continuation" and r["metric"] == "acc" and r["value"] is not None]
    s["acc"] = statistics.fmean(r["value"] for r in acc) if acc else math.nan
    for fam in FAMILIES:
        got = [r["value"] for r in acc if r["family"] == fam]
        s[f"acc_{fam}"] = statistics.fmean(got) if got else math.nan
    s["epochs"] = {k: r["epochs_seen"] for k, r in sorted(val.items())}
    s.update(tail_weights(out, tail))
    return s


def tail_weights(out: Path, tail: list[str]) -> dict[str, float]:
    """How a run weighted the tail (mixture.jsonl): its summed weight at the start, at the end,
    the least and most it ever had, and the number of moves. Why an online rule won or lost
    starts here: did its signal move weight to the tail at all?"""
    from training.checkpoint.run_dir import RunDir
    from training.data.mixture.log import read_log

    moves = [e["weights"] for e in read_log(RunDir(out)) if e["weights"]]
    share = [sum(w.get(l, 0.0) for l in tail) for w in moves]
    return {
        "tail_w_start": share[0],
        "tail_w_end": share[-1],
        "tail_w_min": min(share),
        "tail_w_max": max(share),
        "moves": len(moves) - 1,
    }


def skewed(a: argparse.Namespace) -> None:
    """The verdict on the skewed corpus (module docstring)."""
    a.workdir.mkdir(parents=True, exist_ok=True)
    data, test = prepare_skewed(a.workdir, a.mb, a.floor_kb, a.test_kb)
    n = sizes(data)
    by_size = sorted(n, key=lambda k: (n[k], k))
    tail, head = by_size[:10], by_size[-5:]
    budget = a.steps * a.tokens_per_step
    print(
        f"{len(n)} languages, {sum(n.values()):,} training tokens; budget {budget:,} tokens "
        f"({a.steps} steps × {a.tokens_per_step:,}), {a.seeds} seeds\n"
        f"  tail (fewest training tokens): {', '.join(f'{k} {n[k]:,}' for k in tail)}\n"
        f"  head: {', '.join(f'{k} {n[k]:,}' for k in head)}",
        flush=True,
    )
    common = [f"batch.tokens_per_step={a.tokens_per_step}"]
    known = dict(SKEWED_ARMS)
    for spec in a.extra_arm:  # NAME=ARM:key=value,key=value
        name, _, rest = spec.partition("=")
        base, _, values = rest.partition(":")
        if base not in SKEWED_ARMS:
            raise SystemExit(f"--extra-arm {spec}: {base!r} is not a skewed arm")
        known[name] = [*SKEWED_ARMS[base], *filter(None, values.split(","))]
    arms = a.arms.split(",") if a.arms else list(known)
    unknown = [x for x in arms if x not in known]
    if unknown:
        raise SystemExit(f"--arms: {', '.join(unknown)} not among the skewed arms ({', '.join(known)})")
    # the development round reads the data's own validation split (what the evaluation rules steer
    # by) with seed 0; the verdict, the test split with seeds 1..N
    seeds, runs, judged, into = (
        ([0], "runs-dev", data, "dev") if a.dev else (range(1, a.seeds + 1), "runs", test, "test")
    )
    a.seeds = len(seeds)
    results: dict[str, list[dict]] = {}
    for seed in seeds:
        for arm in arms:
            out = a.workdir / runs / f"{arm}-seed{seed}"
            o = [*common, *known[arm]]
            wall = run_arm(
                arm, seed, data, out, a.steps, a.interval, a.eval_tokens, None, o, judged, a.test_items, into
            )
            r = skewed_summary(out, a.steps, tail, head, into)
            results.setdefault(arm, []).append(r)
            print(
                f"{arm:<12} seed {seed}: mean {r['mean']:.4f} | tail {r['tail']:.4f} | head {r['head']:.4f} | "
                f"acc {r['acc']:.3f} | tail epochs {r['epochs_tail']:.2f}"
                + (f" | {wall:.0f} s" if wall else " | (done before)"),
                flush=True,
            )
    report_skewed(results, arms, a)


def mean_sd(values: list[float]) -> tuple[float, float]:
    return statistics.fmean(values), (statistics.stdev(values) if len(values) > 1 else 0.0)


def report_skewed(results: dict[str, list[dict]], arms: list[str], a: argparse.Namespace) -> None:
    def ms(arm: str, key: str, fmt: str = ".4f") -> str:
        m, sd = mean_sd([r[key] for r in results[arm]])
        return f"{m:{fmt}} ± {sd:{fmt}}"

    print(
        f"\n{'validation (development)' if a.dev else 'test'} split after {a.steps} steps of {a.tokens_per_step:,} tokens, mean ± sd over {a.seeds} seeds"
    )
    cols = ["mean", "worst5", "tail", "head"]
    print("| arm | bpb " + " | bpb ".join(cols) + " | epochs tail | epochs head |\n|---|" + "---|" * (len(cols) + 2))
    for arm in arms:
        cells = [ms(arm, c) for c in cols] + [ms(arm, "epochs_tail", ".2f"), ms(arm, "epochs_head", ".3f")]
        print(f"| {arm} | " + " | ".join(cells) + " |")
    print("\nthe tail's summed weight (mixture.jsonl): start → end [least, most], moves; mean over seeds")
    for arm in arms:
        m = {
            k: statistics.fmean(r[k] for r in results[arm])
            for k in ("tail_w_start", "tail_w_end", "tail_w_min", "tail_w_max", "moves")
        }
        print(
            f"  {arm:<12} {m['tail_w_start']:.4f} → {m['tail_w_end']:.4f} "
            f"[{m['tail_w_min']:.4f}, {m['tail_w_max']:.4f}], {m['moves']:.0f} moves"
        )
    print("\ncontinuation accuracy (chance 0.25), mean over each family's languages")
    accs = ["acc", *(f"acc_{f}" for f in FAMILIES)]
    print("| arm | all | " + " | ".join(FAMILIES) + " |\n|---|" + "---|" * len(accs))
    for arm in arms:
        print(f"| {arm} | " + " | ".join(ms(arm, c, ".3f") for c in accs) + " |")
    lower = {c: min(arms, key=lambda x: mean_sd([r[c] for r in results[x]])[0]) for c in cols}
    higher = {c: max(arms, key=lambda x: mean_sd([r[c] for r in results[x]])[0]) for c in accs}
    print(
        "\nbest per column: "
        + ", ".join(f"bpb {c}: {w}" for c, w in lower.items())
        + "; "
        + ", ".join(f"{c}: {w}" for c, w in higher.items())
    )
    fixed = [x for x in FIXED if x in results]
    if fixed and a.seeds < 2:
        print("\nno verdict: it needs the spread of at least 2 seeds")
    elif fixed:
        best = min(fixed, key=lambda x: mean_sd([r["tail"] for r in results[x]])[0])
        print(
            f"\nverdict: each online rule against the best fixed rule (α, UniMax, schedule) on tail bpb, {best}; "
            "a win is a tail lower by more than 2 × the pooled sd of the two arms' seeds, with a mean and head no "
            "higher (uniform and natural are reference arms, not rules to beat)"
        )
        for arm in [x for x in results if x not in (*FIXED, "natural", "uniform")]:  # the online rules and variants
            line = []
            for c in ("tail", "mean", "head"):
                (m1, s1), (m0, s0) = mean_sd([r[c] for r in results[arm]]), mean_sd([r[c] for r in results[best]])
                line.append(f"{c} {m1 - m0:+.4f} (2 sd {2 * math.hypot(s0, s1):.4f})")
            t1, t0 = (mean_sd([r[c] for r in results[x]]) for c, x in (("tail", arm), ("tail", best)))
            wins = t0[0] - t1[0] > 2 * math.hypot(t0[1], t1[1]) and all(
                mean_sd([r[c] for r in results[arm]])[0] <= mean_sd([r[c] for r in results[best]])[0]
                for c in ("mean", "head")
            )
            print(f"  {arm:<12} " + " | ".join(line) + f" → {'BEATS' if wins else 'does not beat'} {best}")
    out = a.workdir / "report.json"
    out.write_text(json.dumps({"args": {k: str(v) for k, v in vars(a).items()}, "results": results}, indent=1))
    print(f"\nper-seed figures and epochs per language: {out}")
