"""Benchmark of downstream evaluation tasks and decontamination (run by hand; prints figures).

    python -m bench.eval_tasks [--workdir /tmp/bloomline-tasks-bench] [--steps 40] [--items 40]

On shards prepared from ../shared/corpus (bench/train_throughput.py ``prepare``) and bloom-tiny.
No hub is reachable, so the task files are written here from ../shared/corpus in each task's
schema (:func:`write_task_files`): real sentences, the right answer the text's own next sentence
or word, the others taken from other documents of the language.

1. Training tokens/s of ``bloomline train`` with the automatic evaluation running validation only,
   and validation plus every task (continuation and the five local families), beside it; the
   same run otherwise (target: at most 10% slower). ``evaluation.enabled=false`` for reference,
   and the tasks once more without the evaluation's CPU cap (``evaluation.cpu_share=null``); for
   each, how long after training the last evaluation was in (what the cap defers).
2. Seconds per evaluated checkpoint, per task (``eval.publish.evaluate`` on the last checkpoint).
3. bloomline's scoring of each local family (in-process) against lm-eval's own run of the same
   tasks on ``bloomline export``'s folder: wall time of each, and whether every number is equal.
4. Decontamination: the chunks pass (read, normalize, language ID, quality, dedup signatures)
   over the whole shared corpus, serially in this process, without and with the
   ``decontaminate`` step against the task files: documents/s; the index's build time and size
   per million n-grams, and the step's own time per million n-grams checked.
"""

from __future__ import annotations

import argparse
import json
import random
import re
import shutil
import tempfile
import time
from pathlib import Path

import numpy as np

from bench.eval_throughput import train
from bench.repo import REPO, SHARED
from bench.train_throughput import prepare
from bloomline.task_spec import TaskSpec

FAMILIES = ("xstorycloze", "xcopa", "xnli", "xwinograd", "belebele")
_SENT = re.compile(r"(?<=[.!?。！？])\s*")


def sentences(path: Path) -> list[list[str]]:
    """Each document's sentences of at least 3 characters."""
    out = []
    for line in path.read_text(encoding="utf-8").splitlines():
        s = [x.strip() for x in _SENT.split(json.loads(line)["text"]) if len(x.strip()) >= 3]
        if len(s) >= 6:
            out.append(s)
    return out


def record(family: str, doc: list[str], other: list[str], rng: random.Random) -> dict:
    """One item of ``family`` from a document's first sentences; wrong answers from ``other``."""
    s, k = doc, rng.randrange(2)
    if family == "xstorycloze":
        ends = [s[4], other[0]] if k == 0 else [other[0], s[4]]
        return {
            **{f"input_sentence_{i + 1}": s[i] for i in range(4)},
            "sentence_quiz1": ends[0],
            "sentence_quiz2": ends[1],
            "answer_right_ending": 1 + k,
        }
    if family == "xcopa":
        ch = [s[1], other[0]] if k == 0 else [other[0], s[1]]
        return {
            "premise": s[0].rstrip(".。") + ".",
            "choice1": ch[0],
            "choice2": ch[1],
            "question": "effect",
            "label": k,
        }
    if family == "xnli":
        return {"premise": s[0], "hypothesis": s[1] if k == 0 else other[0], "label": 0 if k == 0 else 2}
    if family == "xwinograd":
        words = s[0].split()
        i = max(range(len(words)), key=lambda j: len(words[j])) if len(words) > 1 else 0
        if len(words) < 2:  # no spaces: a character stands in for a word
            words, i = list(s[0]), len(s[0]) // 2
        wrong = other[0].split()[0] if " " in other[0] else other[0][0]
        sent = (
            " ".join(words[:i] + ["_"] + words[i + 1 :]) if " " in s[0] else "".join(words[:i] + ["_"] + words[i + 1 :])
        )
        opts = [words[i], wrong] if k == 0 else [wrong, words[i]]
        return {"sentence": sent, "option1": opts[0], "option2": opts[1], "answer": "12"[k]}
    j = rng.randrange(4)
    answers = other[:3]
    answers.insert(j, s[4])
    return {
        "flores_passage": " ".join(s[:3]),
        "question": s[3],
        **{f"mc_answer{i + 1}": a for i, a in enumerate(answers)},
        "correct_answer_num": str(j + 1),
    }


def write_task_files(root: Path, items: int) -> dict[str, Path]:
    """``root/<family>/<lang>.jsonl`` for every family and language it has that ../shared/corpus has."""
    from eval.tasks import make

    out = {}
    for family in FAMILIES:
        folder = root / family
        folder.mkdir(parents=True, exist_ok=True)
        task = make(TaskSpec(name=family, data=str(folder)))
        for lang in task.subtasks:
            path = SHARED / "text" / f"{lang}.jsonl"
            if not path.exists():
                continue
            docs = sentences(path)
            rng = random.Random(f"{family}:{lang}")
            recs = [record(family, docs[i], docs[(i + 7) % len(docs)], rng) for i in range(min(items, len(docs) - 7))]
            (folder / f"{lang}.jsonl").write_text(
                "".join(json.dumps(r, ensure_ascii=False) + "\n" for r in recs), encoding="utf-8"
            )
        out[family] = folder
    return out


def task_specs(folders: dict[str, Path]) -> list[TaskSpec]:
    return [TaskSpec(name="continuation"), *(TaskSpec(name=f, data=str(p)) for f, p in folders.items())]


def spec_yaml(specs: list[TaskSpec]) -> str:
    return "[" + ", ".join("{name: %s%s}" % (s.name, f", data: {s.data}" if s.data else "") for s in specs) + "]"


def train_throughput(data: Path, wd: Path, steps: int, specs: list[TaskSpec]) -> Path:
    print(
        "1. training tokens/s with the automatic evaluation beside it (bloomline train, 2 cores; target ≤ 10% slower)"
    )
    from eval.results.table import evaluated_steps, results_dir, skipped_steps
    from training.checkpoint.run_dir import RunDir

    runs = {}
    # every checkpoint kept: training never waits for an evaluation to free one (checkpoint.max_deferred),
    # so the figures are what evaluating beside it costs, not how long it holds checkpoints back
    keep = ["checkpoint.keep=100"]
    for label, extra in (
        ("no evaluation", ["evaluation.enabled=false"]),
        ("validation only", ["evaluation.settings.tasks=[]"]),
        ("validation + 6 tasks", [f"evaluation.settings.tasks={spec_yaml(specs)}"]),
        (
            "validation + 6 tasks, no CPU cap",
            [f"evaluation.settings.tasks={spec_yaml(specs)}", "evaluation.cpu_share=null"],
        ),
    ):
        out = wd / f"run-{len(runs)}"
        m = train(data, out, steps, [*keep, *extra])
        after = [x for x in m if x["step"] > 10]  # from the first checkpoint on, when evaluations run
        runs[label] = sum(x["global_batch_tokens"] for x in after) / sum(x["step_seconds"] for x in after)
        line = (
            f"   {label:33s}: {runs[label]:,.0f} tokens/s ({runs[label] / runs['no evaluation']:.3f}× of no evaluation"
        )
        if "tasks" in label:
            line += f", {runs[label] / runs['validation only']:.3f}× of validation only"
        if label != "no evaluation":
            # how far the evaluations lag: the last one's results against the end of training
            lag = (
                max(f.stat().st_mtime for f in results_dir(out).glob("step_*.parquet"))
                - RunDir(out).training_done.stat().st_mtime
            )
            line += (
                f"); evaluated steps {evaluated_steps(out)}, failed {sorted(skipped_steps(out))}, "
                f"the last in {lag:.0f} s after training ended"
            )
        print(line + (")" if label == "no evaluation" else ""), flush=True)
    return wd / "run-2"


def per_task_seconds(run: Path, data: Path, specs: list[TaskSpec]) -> Path:
    from eval.publish import evaluate
    from training.config import EvalConfig

    ckpt = run / "checkpoints" / (run / "checkpoints" / "latest").read_text().strip()
    ev = evaluate(ckpt, data, EvalConfig(tasks=specs, prompts_per_lang=0), "bench")
    print(f"2. one evaluated checkpoint ({ckpt.name}): {ev.seconds:.1f} s in all")
    for name, s in ev.task_seconds.items():
        langs = {
            r["lang"] for r in ev.rows if r["task"] == name and r["scope"] == "language" and r["metric"] != "skipped"
        }
        print(f"   {name:12s}: {s:6.1f} s, {len(langs)} languages")
    return ckpt


def against_lm_eval(ckpt: Path, data: Path, specs: list[TaskSpec]) -> None:
    import sentencepiece as spm

    from bloomline.tokenizer import token_bytes
    from eval.tasks import make
    from eval.tasks.base import Context
    from eval.tasks.lm_eval_local import export_lm_args, run_lm_eval
    from training.checkpoint.load import load_model
    from training.checkpoint.meta import PRECISIONS
    from training.config import EvalConfig
    from training.data.shard_reader import ShardIndex
    from training.hf.to_hf import export

    print("3. bloomline's task scoring against lm-eval's own run on the export (same machine, same items)")
    with tempfile.TemporaryDirectory() as tmp:
        hf = export(ckpt, Path(tmp) / "hf", data)
        model, _ = load_model(ckpt, PRECISIONS["fp32"])
        mf = data / "tokenizer" / "tokenizer.model"
        sp = spm.SentencePieceProcessor(model_file=str(mf))
        index = ShardIndex(data, "valid")
        eos = int(index.manifest["tokenizer"]["eos_id"])
        for spec in specs[1:]:
            task = make(spec)
            import torch

            from eval.model import LocalModel

            ctx = Context(
                model=LocalModel(model.eval(), torch.device("cpu")),
                tokenizer=sp,
                index=index,
                token_bytes=token_bytes(mf),
                tokenizer_file=mf,
                eos_id=eos,
                settings=EvalConfig(),
                spec=spec,
            )
            t0 = time.perf_counter()
            rows = task.run(ctx)
            ours_s = time.perf_counter() - t0
            files, _ = task.plan(spec.data, index.languages, None)
            names = task.write(files, Path(tmp) / spec.name)
            t0 = time.perf_counter()
            try:
                res = run_lm_eval(
                    "hf",
                    list(names.values()),
                    Path(tmp) / spec.name,
                    None,
                    model_args=export_lm_args(hf, model.cfg.seq_len, eos),
                )
            except Exception as e:  # lm-eval's own limits (a choice longer than max_length): say so, go on
                print(
                    f"   {spec.name:12s}: lm-eval's own run failed ({type(e).__name__}: {str(e)[:100]}); "
                    f"bloomline's rows: {sorted({r.note for r in rows if r.metric == 'skipped'})[:2]}"
                )
                continue
            theirs_s = time.perf_counter() - t0
            ours = {(r.lang, r.metric): r.value for r in rows if r.scope == "language" and r.metric != "skipped"}
            theirs = {
                (lang, m): res["results"][n][f"{m},none"]
                for lang, n in names.items()
                for m in ("acc", "acc_norm", "acc_bytes")
            }
            equal = ours == theirs
            n = sum(int(res["n-samples"][x]["effective"]) for x in names.values())
            mean = np.mean([v for (l, m), v in ours.items() if m == "acc"])
            print(
                f"   {spec.name:12s}: {len(names)} languages, {n} items; bloomline {ours_s:5.1f} s, lm-eval on the export "
                f"{theirs_s:5.1f} s ({theirs_s / ours_s:.2f}×); numbers equal: {equal}; mean acc {mean:.3f}"
            )


def decontamination(folders: dict[str, Path]) -> None:
    from bloomline.config import load_config
    from data_prep.config import DecontaminateConfig, PrepareConfig, SourceConfig
    from data_prep.inputs.chunk_plan import plan_chunks
    from data_prep.passes.budget import bundle_bytes
    from data_prep.passes.chunks import process_chunk
    from data_prep.steps.decontaminate import build_index
    from data_prep.storage.workdir import Paths

    print("4. decontamination on ../shared/corpus (the chunks pass, serial, this process)")
    specs = [TaskSpec(name=f, data=str(p)) for f, p in folders.items()]
    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        t0 = time.perf_counter()
        summary = build_index(DecontaminateConfig(tasks=specs), tmp / "index")
        build_s = time.perf_counter() - t0
        size = sum(p.stat().st_size for p in (tmp / "index").iterdir())
        per_m = 1e6 / max(summary["ngrams"], 1)
        print(
            f"   index: {summary['ngrams']:,} n-grams of {sum(f['items'] for f in summary['files']):,} items "
            f"({sum(f['too_short'] for f in summary['files'])} too short) in {build_s:.2f} s, {size / 2**20:.2f} MiB: "
            f"{build_s * per_m:.1f} s and {size * per_m / 2**20:.1f} MiB per million n-grams"
        )
        results = {}
        for label, tasks in (
            ("without", []),
            ("with", specs),
            ("without", []),
            ("with", specs),
        ):  # alternated, best of 2
            cfg = load_config(PrepareConfig, REPO / "configs/data/demo.yaml", [])
            cfg.sources = [SourceConfig(path=str(SHARED))]
            cfg.decontaminate = DecontaminateConfig(tasks=tasks)
            out = tmp / f"out-{label}"
            shutil.rmtree(out, ignore_errors=True)
            paths = Paths(out)
            paths.work.mkdir(parents=True)
            if tasks:
                build_index(cfg.decontaminate, paths.decontaminate)
            chunks = [c.to_dict() for c in plan_chunks(cfg.sources, cfg.read, bundle_bytes(cfg))]
            t0 = time.perf_counter()
            sums = [process_chunk(c, cfg, str(out)) for c in chunks]
            dt = time.perf_counter() - t0
            docs = sum(s["steps"]["read"]["records"] for s in sums)
            dropped = sum(s["steps"].get("decontaminate", {}).get("dropped", {}).get("contaminated", 0) for s in sums)
            step_s = sum(s["seconds"].get("decontaminate", 0.0) for s in sums)
            checked = sum(s["steps"].get("decontaminate", {}).get("ngrams_checked", 0) for s in sums)
            if label not in results or docs / dt > results[label][0]:
                results[label] = (docs / dt, docs, dropped, step_s, checked, dt)
        base = results["without"][0]
        for label, (rate, docs, dropped, step_s, checked, dt) in results.items():
            # (the documents it drops skip the dedup signatures after it: the step's own time is the honest cost)
            extra = (
                (
                    f"; {dropped} documents contaminated; the step itself {step_s:.2f} s, {step_s / dt:.1%} of the "
                    f"stage, for {checked:,} n-grams checked ({step_s * 1e6 / max(checked, 1):.2f} s per million)"
                )
                if label == "with"
                else ""
            )
            print(f"   {label:8s}: {docs:,} documents, {rate:,.0f} docs/s ({rate / base:.3f}×){extra}")


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--workdir", type=Path, default=Path("/tmp/bloomline-tasks-bench"))
    ap.add_argument("--steps", type=int, default=40)
    ap.add_argument("--items", type=int, default=40, help="items per task and language")
    ap.add_argument("--only", choices=["train", "tasks", "decontaminate"], default=None)
    args = ap.parse_args()
    if not SHARED.is_dir():
        raise SystemExit(f"{SHARED} not found")
    args.workdir.mkdir(parents=True, exist_ok=True)
    folders = write_task_files(args.workdir / "tasks", args.items)
    specs = task_specs(folders)
    if args.only in (None, "decontaminate"):
        decontamination(folders)
    if args.only == "decontaminate":
        return
    data = prepare(args.workdir)
    run = args.workdir / "run-2"
    if args.only in (None, "train") or not (run / "checkpoints" / "latest").exists():
        run = train_throughput(data, args.workdir, args.steps, specs)
    if args.only == "train":
        return
    ckpt = per_task_seconds(run, data, specs)
    against_lm_eval(ckpt, data, specs)


if __name__ == "__main__":
    main()
