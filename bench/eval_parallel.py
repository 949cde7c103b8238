"""Benchmark of the parallel evaluator (eval/parallel/, issue 38; run by hand; prints figures).

    DS_ACCELERATOR=cpu python -m bench.eval_parallel [--workdir /tmp/bloomline-parallel-bench]
        [--layers 6] [--items 8] [--max-tokens 256] [--layouts 1x1,2x2] [--quick]

About 11 minutes on 2 cores; ``--quick`` (bloom-tiny, layouts (1,1) and (2,1), a few items) is a
smoke run of every part in about a minute. On the demo data (configs/data/demo.yaml, prepared
into the workdir once, then reused) and a checkpoint written directly from a randomly initialised
``Bloom`` (no training: the figures are about time and memory, not accuracy): bloom-560m's width
(hidden 1024, 16 heads) with ``--layers`` layers, the data's vocabulary and largest bucket, fp32.

1. ``bloomline evaluate``'s work on one checkpoint in each layout tp × pp (1,1), (2,1), (1,2),
   (2,2): ``eval.publish.evaluate`` in a fresh subprocess each, on the CPU (validation with
   ``max_tokens_per_lang``, ``continuation`` and ``xstorycloze`` on three languages, the default
   generations): its wall time, split into starting the ranks and loading, each task
   (``Evaluation.task_seconds``), the generations, and the ranks' exit after rank 0's results;
   torch threads per rank: the host's cores ÷ the ranks (one each where ranks share 2 cores).
   Whether every layout's numbers are the single process's (largest relative difference of any
   result row), and the share of the cores other processes used meanwhile (on a shared host,
   threads that share a core with another job wait for each other: rerun when it is not ~0).
2. Each process's peak RSS (tests/support/proctree.py, every 0.1 s): the driver (the process that called
   ``evaluate``: the model's only process at (1,1)) and each rank; less a bare process that
   imports torch, DeepSpeed and megatron-core; in each phase of 1; beside eval/parallel/plan.py's
   estimate. Target: the largest rank at (2,2) at most 0.5× the single process.
3. Greedy decoding at 24 new tokens from 16-token prompts (eos ignored, so every prompt makes all
   its tokens): ``eval.generate.generate`` on a ``LocalModel`` (the key-value cache) for a batch of
   16 prompts and for one prompt at a time, against ``greedy`` (no cache: the whole sequence again
   for every token) prompt by prompt; alternated, best of 2. Target: the batch ≥ 5× the cache-free.
4. ``xstorycloze`` on our single-process evaluator (the task's ``run`` on a ``LocalModel``, as
   ``evaluate`` calls it at (1,1)) against lm-eval's own ``--model hf`` run on ``bloomline
   export``'s folder (eval/tasks/lm_eval_local.py ``run_lm_eval``), same items, same threads, in
   one subprocess, alternated, best of 2 (lm-eval imported before either): target ≤ 1.1×; whether
   the numbers are equal. Then its seconds inside ``evaluate`` in every layout of 1.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from bench.repo import REPO
from tests.support.proctree import Sampled, run_sampled

LAYOUTS = ((1, 1), (2, 1), (1, 2), (2, 2))
QUICK_LAYOUTS = ((1, 1), (2, 1))
CORES = os.cpu_count() or 1
NEW_TOKENS = 24
PROMPT_TOKENS = 16
MIB = 2**20


# --- setup ---------------------------------------------------------------------------------------


def prepare(wd: Path) -> Path:
    """The demo data (configs/data/demo.yaml) in ``wd/data``, prepared once."""
    from bloomline.config import load_config
    from data_prep.config import PrepareConfig
    from data_prep.pipeline import run_all

    out = wd / "data"
    if not (out / "manifest.json").exists():
        run_all(load_config(PrepareConfig, REPO / "configs/data/demo.yaml"), out)
    return out


def write_checkpoint(wd: Path, data: Path, quick: bool, layers: int) -> Path:
    """A 1-rank checkpoint of a randomly initialised Bloom (as tests/eval/tasks/test_lm_eval_local.py
    ``exported`` writes one): bloom-560m's width with ``layers`` layers, or bloom-tiny; the data's
    vocabulary and largest bucket as its sequence length."""
    import torch

    from bloomline.config import load_config
    from bloomline.io import sha256_file
    from data_prep.storage.shards import load_manifest
    from training.checkpoint.meta import make_meta
    from training.config import TrainRecipe
    from training.model.bloom import Bloom

    manifest = load_manifest(data)
    vocab = int(manifest["tokenizer"]["vocab_size"])
    if quick:
        recipe, extra = "bloom-tiny", []
    else:
        recipe = "bloom-560m"
        extra = [f"model.num_layers={layers}", "model.pad_vocab_to=null", f"model.seq_len={max(manifest['buckets'])}"]
    r = load_config(
        TrainRecipe,
        REPO / f"configs/train/{recipe}.yaml",
        [f"model.vocab_size={vocab}", "parallel.zero_stage=0", *extra],
    )
    step = wd / f"run-{recipe}-{r.model.num_layers}" / "checkpoints" / "step_1"
    if (step / "bloomline.json").exists():
        return step
    step.mkdir(parents=True, exist_ok=True)
    model = Bloom(r.model, seed=7)
    torch.save({"module": model.state_dict()}, step / "mp_rank_00_model_states.pt")
    sampler = {"version": 2, "seed": 1, "step": 1, "consumed_tokens": 0, "tokens_by_lang": {}, "streams": {}}
    trainer = {"skipped": 0, "fp16_overflows": 0, "skipped_in_a_row": 0, "loss_ema": None}
    meta = make_meta(1, r, data, sha256_file(data / "manifest.json"), sampler, trainer)
    (step / "bloomline.json").write_text(json.dumps(meta))
    return step


def write_xstorycloze(root: Path, langs: list[str], items: int) -> Path:
    """``root/xstorycloze/<lang>.jsonl`` from ../shared/corpus (bench/eval_tasks.py's records)."""
    import random

    from bench.eval_tasks import record, sentences
    from bench.train_throughput import SHARED

    folder = root / "xstorycloze"
    folder.mkdir(parents=True, exist_ok=True)
    for lang in langs:
        docs = sentences(SHARED / "text" / f"{lang}.jsonl")
        rng = random.Random(f"xstorycloze:{lang}")
        recs = [record("xstorycloze", docs[i], docs[(i + 7) % len(docs)], rng) for i in range(items)]
        (folder / f"{lang}.jsonl").write_text(
            "".join(json.dumps(r, ensure_ascii=False) + "\n" for r in recs), encoding="utf-8"
        )
    return folder


# --- the subprocesses ----------------------------------------------------------------------------


def child(spec_file: Path) -> None:
    """Run one measured job (``--child``) and write what it found to the spec's ``out``."""
    spec = json.loads(spec_file.read_text())
    if spec["kind"] == "bare":
        import deepspeed  # noqa: F401
        import megatron.core  # noqa: F401
        import torch  # noqa: F401

        if spec.get("lm_eval"):
            import lm_eval  # noqa: F401
            from lm_eval.models.huggingface import HFLM  # noqa: F401

        time.sleep(0.5)  # (a few samples of the settled process)
        return
    if spec["kind"] == "evaluate":  # bloomline evaluate's work
        from bloomline.config import from_dict
        from eval.publish import evaluate
        from training.config import EvalConfig

        cfg = from_dict(EvalConfig, spec["cfg"])
        t0, t_start = time.perf_counter(), time.time()
        ev = evaluate(spec["ckpt"], spec["data"], cfg, "bench")
        got = {
            "t_start": t_start,
            "t_end": time.time(),
            "wall": time.perf_counter() - t0,
            "seconds": ev.seconds,
            "task_seconds": ev.task_seconds,
            "tokens": ev.tokens,
            "generations": len(ev.generations),
            "rows": [
                {k: r[k] for k in ("task", "scope", "lang", "weighting", "metric", "value")}
                for r in ev.rows
                if r["metric"] != "skipped"
            ],
        }
    else:  # the task on our single-process evaluator and in lm-eval's own run on the export, alternated
        import sentencepiece as spm
        import torch

        from bloomline.config import from_dict
        from bloomline.task_spec import TaskSpec
        from bloomline.tokenizer import token_bytes
        from eval.model import LocalModel
        from eval.tasks import make
        from eval.tasks.base import Context
        from eval.tasks.lm_eval_local import export_lm_args, run_lm_eval
        from training.checkpoint.load import load_model
        from training.checkpoint.meta import PRECISIONS
        from training.config import EvalConfig
        from training.data.shard_reader import ShardIndex

        torch.set_num_threads(spec["threads"])
        data = Path(spec["data"])
        task_spec = from_dict(TaskSpec, spec["task"])
        task = make(task_spec)
        index = ShardIndex(data, "valid")
        tok_file = data / index.manifest["tokenizer"]["path"]
        bloom, _ = load_model(Path(spec["ckpt"]), PRECISIONS["fp32"])
        ctx = Context(  # as eval/evaluate.py evaluate_with builds it
            model=LocalModel(bloom, torch.device("cpu")),
            tokenizer=spm.SentencePieceProcessor(model_file=str(tok_file)),
            index=index,
            token_bytes=token_bytes(tok_file),
            tokenizer_file=tok_file,
            eos_id=spec["eos"],
            settings=EvalConfig(),
            spec=task_spec,
        )
        files, _ = task.plan(task_spec.data, index.languages, task_spec.langs)
        folder = Path(spec["out"]).parent / "lm-eval-tasks"
        names = task.write(files, folder)
        import lm_eval  # noqa: F401  (imported before either is timed: the first would pay for both)
        from lm_eval.models.huggingface import HFLM  # noqa: F401

        ours_s, theirs_s = [], []
        for _ in range(spec["rounds"]):
            t0 = time.perf_counter()
            rows = task.run(ctx)
            ours_s.append(time.perf_counter() - t0)
            t0 = time.perf_counter()
            res = run_lm_eval(
                "hf",
                list(names.values()),
                folder,
                task_spec.limit,
                model_args=export_lm_args(spec["hf"], spec["seq_len"], spec["eos"]),
            )
            theirs_s.append(time.perf_counter() - t0)
        metrics = ("acc", "acc_norm", "acc_bytes")
        got = {
            "ours_s": ours_s,
            "theirs_s": theirs_s,
            "ours": {f"{r.lang} {r.metric}": r.value for r in rows if r.scope == "language" and r.metric in metrics},
            "theirs": {f"{lang} {m}": res["results"][n][f"{m},none"] for lang, n in names.items() for m in metrics},
            "items": sum(int(res["n-samples"][n]["effective"]) for n in names.values()),
        }
    Path(spec["out"]).write_text(json.dumps(got))


def busy_seconds() -> float:
    """CPU seconds the host's cores have been busy (every process's), since boot."""
    import psutil

    t = psutil.cpu_times()
    return sum(t) - t.idle - getattr(t, "iowait", 0.0)


def measured(wd: Path, name: str, spec: dict[str, Any]) -> tuple[dict[str, Any], Sampled]:
    """Run ``spec`` in a fresh ``--child`` process, sampling its process tree (every sample kept).
    In what it found, ``other_cpu``: the share of the host's cores that processes outside the tree
    used meanwhile (another job on the host disturbs the timings; 2 threads suffer most); and for a
    parallel evaluation ``t_result``, when rank 0's results appeared (eval/parallel/launch.py's
    temporary ``result.json``, in a TMPDIR of the run's own): the end of its evaluation, which the
    driver only learns seconds later, once every rank and the launcher have exited."""
    import shutil
    import threading

    spec = {**spec, "out": str(wd / f"{name}.json")}
    spec_file = wd / f"{name}.spec.json"
    spec_file.write_text(json.dumps(spec))
    Path(spec["out"]).unlink(missing_ok=True)
    tmp = wd / "tmp" / name
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    result: list[float] = []
    done = threading.Event()

    def watch() -> None:
        while not done.wait(0.02) and not result:
            if any(tmp.glob("bloomline-eval-*/result.json")):
                result.append(time.time())

    watcher = threading.Thread(target=watch, daemon=True)
    watcher.start()
    cmd = [sys.executable, "-m", "bench.eval_parallel", "--child", str(spec_file)]
    busy = busy_seconds()
    s = run_sampled(cmd, REPO, {**os.environ, "TMPDIR": str(tmp)}, timeline=True)
    other = max(0.0, busy_seconds() - busy - sum(s.cpu.values())) / (s.seconds * CORES)
    done.set()
    watcher.join()
    if s.returncode != 0:
        raise SystemExit(f"{name} failed (exit {s.returncode}):\n{s.stderr[-3000:]}")
    out = Path(spec["out"])
    got = json.loads(out.read_text()) if out.exists() else {}
    return {**got, "other_cpu": other, "t_result": result[0] if result else None}, s


def processes(s: Sampled) -> dict[str, int]:
    """The driver's and each rank's pid (by its --local_rank); the launchers left out, and a rank's
    short-lived forks (they carry its command line until they exec): a rank is the longest-lived
    process of its command line."""
    import re

    seen: dict[int, int] = {}
    for _, rss in s.timeline:
        for pid in rss:
            seen[pid] = seen.get(pid, 0) + 1
    out: dict[str, int] = {}
    for pid in s.peaks:
        cmd = s.cmdlines.get(pid, "")
        if s.roles[pid] == "driver":
            out["driver"] = pid
        elif "eval/parallel/main.py" in cmd and "--local_rank" in cmd:  # (the launchers name it too)
            rank = re.search(r"--local_rank[= ](\d+)", cmd)
            who = f"rank {rank.group(1) if rank else '?'}"
            if who not in out or seen.get(pid, 0) > seen.get(out[who], 0):
                out[who] = pid
    return dict(sorted(out.items(), key=lambda kv: (kv[0] != "driver", kv[0])))


PHASES = ("start+load", "validation", "continuation", "xstorycloze", "generations")


def phase_peaks(got: dict[str, Any], s: Sampled) -> dict[int, dict[str, float]]:
    """Each process's peak RSS (MiB) in each phase of an evaluation: starting (the ranks) and
    loading, each task, the generations. The phases are placed back from the end of the evaluation
    by its seconds and task seconds: the end of ``evaluate`` in the driver at (1,1), the moment
    rank 0's results appeared in a parallel layout (to within the 0.1 s between samples)."""
    end = got["t_result"] or got["t_end"]
    t = end - got["seconds"]
    bounds = [("start+load", 0.0, t)]
    for name, sec in got["task_seconds"].items():
        bounds.append((name, t, t + sec))
        t += sec
    bounds.append(("generations", t, end))
    out: dict[int, dict[str, float]] = {}
    for when, rss in s.timeline:
        phase = next((name for name, a, b in bounds if a <= when < b), None)
        for pid, v in rss.items():
            mine = out.setdefault(pid, {})
            if phase is not None:
                mine[phase] = max(mine.get(phase, 0.0), v)
    return out


# --- the parts -----------------------------------------------------------------------------------


def eval_settings(tp: int, pp: int, specs: list[Any], max_tokens: int) -> dict[str, Any]:
    from bloomline.config import to_dict
    from training.config import EvalConfig
    from training.config.evaluation import EvalParallelConfig

    cfg = EvalConfig(
        device="cpu",
        precision="fp32",
        parallel=EvalParallelConfig(tp=tp, pp=pp),
        max_tokens_per_lang=max_tokens,
        threads=max(1, CORES // (tp * pp)),
        tasks=specs,
    )
    return to_dict(cfg)


def plan_mib(model: Any, tp: int, pp: int, batch_tokens: int) -> list[tuple[float, float]]:
    """eval/parallel/plan.py's memory per rank of each stage, MiB: its weights, and everything
    (weights, one full batch's activations and logits) without a device's constant overhead."""
    from eval.parallel.plan import eval_stages
    from training.planning.planner import GIB, Device

    cpu = Device("cpu", 1e9, None, None, per_node=CORES, overhead_gib=0.0)
    stages = eval_stages(model, tp, pp, batch_tokens, 4, cpu)
    return [(st.weights_gib * GIB / MIB, st.memory_gib * GIB / MIB) for st in stages]


def layouts(wd, ckpt, data, specs, max_tokens, which) -> dict[tuple[int, int], tuple[dict, Sampled]]:
    out = {}
    for tp, pp in which:
        cfg = eval_settings(tp, pp, specs, max_tokens)
        out[(tp, pp)] = measured(
            wd, f"eval-tp{tp}-pp{pp}", {"kind": "evaluate", "ckpt": str(ckpt), "data": str(data), "cfg": cfg}
        )
        print(
            f"   ({tp},{pp}) done in {out[(tp, pp)][1].seconds:.0f} s (other processes used "
            f"{out[(tp, pp)][0]['other_cpu']:.0%} of the cores meanwhile)",
            flush=True,
        )
    return out


def differences(base: list[dict], other: list[dict]) -> float:
    """Largest relative difference between two evaluations' rows of the same key."""
    key = lambda r: (r["task"], r["scope"], r["lang"], r["weighting"], r["metric"])  # noqa: E731
    ref = {key(r): r["value"] for r in base}
    worst = 0.0
    for r in other:
        a, b = ref.get(key(r)), r["value"]
        if a is None or b is None:
            continue
        worst = max(worst, abs(a - b) / max(abs(a), 1e-12))
    return worst


def generation(ckpt: Path, data: Path, prompts_n: int, rounds: int) -> dict[str, Any]:
    """Tokens/s of greedy decoding with the key-value cache (a batch; one prompt at a time) and without."""
    import psutil
    import torch

    from eval.generate import generate, greedy
    from eval.model import LocalModel
    from eval.tasks.validation import language_samples
    from training.checkpoint.load import load_model
    from training.checkpoint.meta import PRECISIONS
    from training.data.shard_reader import ShardIndex

    torch.set_num_threads(CORES)
    bloom, _ = load_model(ckpt, PRECISIONS["fp32"])
    model = LocalModel(bloom, torch.device("cpu"))
    index = ShardIndex(data, "valid")
    prompts = []
    for lang in index.languages:  # each language's first validation document, as the evaluation's prompts
        (_, refs), *_ = language_samples(index, lang, None)
        toks, offsets = index.fetch(*refs[0])
        doc = toks[int(offsets[0]) : int(offsets[0]) + PROMPT_TOKENS].tolist()
        if len(doc) == PROMPT_TOKENS:
            prompts.append(doc)
        if len(prompts) == prompts_n:
            break
    no_eos = -1  # every prompt makes all its tokens: both sides do the same work
    generate(model, prompts[:2], 2, no_eos)  # warm-up
    greedy(bloom, prompts[0], 2, no_eos)
    made = len(prompts) * NEW_TOKENS
    best = {"batch": 0.0, "one": 0.0, "none": 0.0}
    me, busy, t_all = psutil.Process(), busy_seconds(), time.perf_counter()
    mine = sum(me.cpu_times()[:2])
    for _ in range(rounds):  # alternated, the best of each: a busy host slows them alike
        t0 = time.perf_counter()
        batch = generate(model, prompts, NEW_TOKENS, no_eos)
        best["batch"] = max(best["batch"], made / (time.perf_counter() - t0))
        t0 = time.perf_counter()
        ones = [generate(model, [p], NEW_TOKENS, no_eos)[0] for p in prompts]
        best["one"] = max(best["one"], made / (time.perf_counter() - t0))
        t0 = time.perf_counter()
        ref = [greedy(bloom, p, NEW_TOKENS, no_eos) for p in prompts]
        best["none"] = max(best["none"], made / (time.perf_counter() - t0))
    other = busy_seconds() - busy - (sum(me.cpu_times()[:2]) - mine)
    return {
        "prompts": len(prompts),
        "rounds": rounds,
        **best,
        "same": batch == ref and ones == ref,
        "other_cpu": max(0.0, other) / ((time.perf_counter() - t_all) * CORES),
    }


# --- main ----------------------------------------------------------------------------------------


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--workdir", type=Path, default=Path("/tmp/bloomline-parallel-bench"))
    ap.add_argument("--layers", type=int, default=6, help="layers of the bloom-560m-wide model")
    ap.add_argument("--items", type=int, default=8, help="items per language of continuation and xstorycloze")
    ap.add_argument("--max-tokens", type=int, default=256, help="validation tokens per language")
    ap.add_argument("--quick", action="store_true", help="bloom-tiny, (1,1) and (2,1), few items: a smoke run")
    ap.add_argument("--layouts", help="tp×pp layouts to run, e.g. 1x1,2x2 (default: all four; --quick: 1x1,2x1)")
    ap.add_argument("--child", type=Path, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child:
        child(args.child)
        return
    t_start = time.perf_counter()
    from bloomline.task_spec import TaskSpec
    from training.checkpoint.meta import model_config, read_meta

    wd = args.workdir
    wd.mkdir(parents=True, exist_ok=True)
    langs = ["en"] if args.quick else ["en", "sw", "zh-Hans"]
    items = 4 if args.quick else args.items
    max_tokens = 64 if args.quick else args.max_tokens
    which = QUICK_LAYOUTS if args.quick else LAYOUTS
    if args.layouts:
        which = tuple(tuple(int(x) for x in lay.split("x")) for lay in args.layouts.split(","))
    if (1, 1) not in which:
        which = ((1, 1), *which)  # every comparison is with the single process
    data = prepare(wd)
    ckpt = write_checkpoint(wd, data, args.quick, args.layers)
    meta = read_meta(ckpt)
    m = model_config(meta)
    manifest = json.loads((data / "manifest.json").read_text())
    eos = int(manifest["tokenizer"]["eos_id"])
    story = TaskSpec(
        name="xstorycloze", data=str(write_xstorycloze(wd / "tasks", langs, items)), langs=langs, limit=items
    )
    specs = [TaskSpec(name="continuation", langs=langs, limit=items), story]
    import torch

    from training.config import EvalConfig
    from training.model.bloom import Bloom

    batch_tokens = EvalConfig().batch_tokens
    with torch.device("meta"):
        params = Bloom(m).num_params()
    print(
        f"model: hidden {m.hidden_size}, {m.num_heads} heads, {m.num_layers} layers, vocabulary {m.vocab_size}, "
        f"sequence {m.seq_len}: {params / 1e6:.1f} M parameters, {params * 4 / MIB:.0f} MiB in fp32; host: {CORES} "
        f"cores, {os.sysconf('SC_PAGE_SIZE') * os.sysconf('SC_PHYS_PAGES') / 2**30:.0f} GiB"
    )
    print(
        f"evaluation: validation ≤ {max_tokens} tokens × {len({sh['lang'] for sh in manifest['shards']})} languages, "
        f"continuation and xstorycloze {items} items × {', '.join(langs)}, 2 generations per language; fp32, CPU",
        flush=True,
    )

    if args.quick:
        print("--quick: a smoke run of every part; bloom-tiny's figures say nothing of the targets", flush=True)
    _, s_bare = measured(wd, "bare", {"kind": "bare"})
    _, s_bare_lm = measured(wd, "bare-lm-eval", {"kind": "bare", "lm_eval": True})
    base = s_bare.peak("driver")
    if any(tp * pp > 1 for tp, pp in which):
        # every rank loads DeepSpeed's shared-memory comm op on the CPU, JIT-built into
        # ~/.cache/torch_extensions the first time (and again after another install built it there):
        # built here, so that no layout's start pays for it
        t0 = time.perf_counter()
        op = "from deepspeed.comm.torch import build_shm_op; build_shm_op()"
        subprocess.run([sys.executable, "-c", op], check=True, capture_output=True)
        print(f"DeepSpeed's shm comm op built or loaded in {time.perf_counter() - t0:.1f} s, before the layouts")
    print("1. running the layouts", flush=True)
    runs = layouts(wd, ckpt, data, specs, max_tokens, which)

    print("2. greedy decoding", flush=True)
    gen = generation(ckpt, data, 4 if args.quick else 16, 1 if args.quick else 2)

    print("3. lm-eval's own run on the export", flush=True)
    from training.hf.to_hf import export

    hf = wd / f"hf-{ckpt.parent.parent.name}"
    if not (hf / "config.json").exists():
        export(ckpt, hf, data)
    vs, _ = measured(
        wd,
        "versus-lm-eval",
        {
            "kind": "versus",
            "ckpt": str(ckpt),
            "data": str(data),
            "task": {"name": story.name, "data": story.data, "langs": story.langs, "limit": story.limit},
            "hf": str(hf),
            "seq_len": m.seq_len,
            "eos": eos,
            "threads": CORES,
            "rounds": 1 if args.quick else 2,
        },
    )

    # --- the tables ---
    single = runs[(1, 1)][0]
    print()
    print(
        "Evaluation of one checkpoint (eval.publish.evaluate in a subprocess), seconds; others' CPU: the share of "
        "the cores other processes on the host used meanwhile"
    )
    cols = ("start+load", "validation", "continuation", "xstorycloze", "generations", "exit")
    print(
        f"{'tp×pp':6s} {'ranks':>5s} {'thr/rank':>8s} {'wall':>6s} "
        + " ".join(f"{c:>{max(len(c), 5)}s}" for c in cols)
        + f" {'rel. Δ vs (1,1)':>15s} {'others’ CPU':>11s}"
    )
    for (tp, pp), (got, _) in runs.items():
        ts = got["task_seconds"]
        end = got["t_result"] or got["t_end"]  # rank 0's results; the driver returns once the ranks have exited
        spans = {
            "start+load": end - got["seconds"] - got["t_start"],
            **ts,
            "generations": got["seconds"] - sum(ts.values()),
            "exit": got["t_end"] - end,
        }
        print(
            f"({tp},{pp})  {tp * pp:5d} {max(1, CORES // (tp * pp)):8d} {got['wall']:6.1f} "
            + " ".join(f"{spans.get(c, 0.0):{max(len(c), 5)}.1f}" for c in cols)
            + f" {differences(single['rows'], got['rows']):15.1e} {got['other_cpu']:11.0%}"
        )
    print(f"({single['tokens']:,} validation tokens, {single['generations']} generations per checkpoint)")

    print()
    print(
        f"Peak RSS per process, MiB: in all, less a bare process (torch+deepspeed+megatron imported: {base:.0f} MiB; "
        f"with lm-eval+transformers too: {s_bare_lm.peak('driver'):.0f} MiB), and in each phase. plan: "
        f"eval/parallel/plan.py's estimate of the rank's weights, and of weights + activations + logits of a full "
        f"{batch_tokens}-token batch (this data's validation batches are far smaller). The driver of a parallel "
        f"layout only waits for rank 0."
    )
    print(
        f"{'tp×pp':6s} {'process':8s} {'peak':>6s} {'− bare':>6s} "
        + " ".join(f"{p:>{max(len(p), 6)}s}" for p in PHASES)
        + f" {'plan: weights':>13s} {'full batch':>10s} {'÷ (1,1)':>7s}"
    )
    peaks = {}
    for lay, (got, s) in runs.items():
        procs = processes(s)
        peaks[lay] = (procs, phase_peaks(got, s), s.peaks)
    one_pid = peaks[(1, 1)][0]["driver"]
    one = peaks[(1, 1)][2][one_pid]
    for (tp, pp), (procs, phases, all_peaks) in peaks.items():
        plan = plan_mib(m, tp, pp, batch_tokens)
        for who, pid in procs.items():
            est = ["", ""]
            if (tp, pp) == (1, 1) or who != "driver":
                rank = 0 if who == "driver" else int(who.split()[1])
                est = [f"{x:.0f}" for x in plan[rank // tp]]
            peak = all_peaks[pid]
            by_phase = " ".join(
                f"{phases.get(pid, {}).get(p, 0.0):{max(len(p), 6)}.0f}"
                if phases.get(pid, {}).get(p)
                else f"{'':>{max(len(p), 6)}s}"
                for p in PHASES
            )
            print(
                f"({tp},{pp})  {who:8s} {peak:6.0f} {max(peak - base, 0.0):6.0f} {by_phase} {est[0]:>13s} {est[1]:>10s} "
                f"{peak / one:7.2f}"
            )
    if (2, 2) in peaks:
        procs, phases, all_peaks = peaks[(2, 2)]
        ranks = [pid for who, pid in procs.items() if who != "driver"]
        worst = max(all_peaks[pid] for pid in ranks)
        print(
            f"target: the largest rank at (2,2) ≤ 0.5× the single process: {worst:.0f} / {one:.0f} MiB = "
            f"{worst / one:.2f}× ({'met' if worst <= 0.5 * one else 'MISSED'}); less the bare process: "
            f"{(worst - base) / (one - base):.2f}×"
        )
        one_phases = peaks[(1, 1)][1][one_pid]
        print(
            "   per phase, largest rank ÷ single process: "
            + ", ".join(
                f"{p} {max(phases.get(pid, {}).get(p, 0.0) for pid in ranks) / one_phases[p]:.2f}×"
                for p in PHASES
                if one_phases.get(p)
            )
        )

    print()
    print(
        f"Greedy decoding, {gen['prompts']} prompts of {PROMPT_TOKENS} tokens, {NEW_TOKENS} new tokens each, "
        f"{CORES} threads, best of {gen['rounds']} alternated (tokens/s); same tokens all three ways: {gen['same']}; "
        f"others' CPU {gen['other_cpu']:.0%}"
    )
    print(
        f"   generate, KV cache, the {gen['prompts']} prompts as one batch: {gen['batch']:8.1f}  ({gen['batch'] / gen['none']:.1f}× the cache-free)"
    )
    print(f"   generate, KV cache, one prompt at a time:         {gen['one']:8.1f}  ({gen['one'] / gen['none']:.1f}×)")
    print(f"   greedy, no cache, one prompt at a time:           {gen['none']:8.1f}")
    print(f"target: ≥ 5× ({'met' if gen['batch'] / gen['none'] >= 5 else 'MISSED'})")

    print()
    ours_s, theirs_s = min(vs["ours_s"]), min(vs["theirs_s"])
    in_eval = single["task_seconds"]["xstorycloze"]
    print(
        f"xstorycloze, {vs['items']} items ({', '.join(langs)}), {CORES} threads, in one process, alternated, best of "
        f"{len(vs['ours_s'])}: bloomline's evaluator (LocalModel, as at (1,1)) {ours_s:.1f} s, lm_eval --model hf on "
        f"the export {theirs_s:.1f} s: {ours_s / theirs_s:.2f}× (target ≤ 1.1×: "
        f"{'met' if ours_s <= 1.1 * theirs_s else 'MISSED'}); numbers equal: {vs['ours'] == vs['theirs']}; "
        f"others' CPU {vs['other_cpu']:.0%}"
    )
    print(f"   inside evaluate, (1,1): {in_eval:.1f} s ({in_eval / theirs_s:.2f}× lm-eval's)")
    for (tp, pp), (got, _) in runs.items():
        if (tp, pp) != (1, 1):
            x = got["task_seconds"]["xstorycloze"]
            print(f"   inside evaluate, ({tp},{pp}): {x:.1f} s ({x / theirs_s:.2f}× lm-eval's)")
    shared = max([vs["other_cpu"], gen["other_cpu"], *(got["other_cpu"] for got, _ in runs.values())])
    print(f"total bench wall time {time.perf_counter() - t_start:.0f} s")
    if shared > 0.1:
        print(
            f"NOTE: other processes used up to {shared:.0%} of the host's cores during a part: its timings are "
            f"disturbed (threads that share a core with another job wait for each other); rerun on a quiet host"
        )


if __name__ == "__main__":
    main()
