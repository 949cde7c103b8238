"""One arm of the mixture benchmarks, trained and evaluated: :func:`run_arm` trains bloom-tiny with
an arm's recipe values and one seed, and evaluates its final checkpoint (the data's validation
split, or a prepared test set). The balanced benchmark's arms (``ARMS``, bench/mixture.py's
docstring says what each is), the skewed verdict (bench/mixture_skewed.py) and the adaptation
benchmark (bench/adapt.py) all run their arms through it; it lives apart from them so that
bench/mixture.py can start the skewed verdict without the two importing each other."""

from __future__ import annotations

import time
from pathlib import Path

from bench.repo import REPO, cli
from bloomline import languages

ARMS = {
    "alpha": [],
    "uniform": [],
    "bandit": ["batch.mixture=online", "batch.online.rule=bandit"],
    "evaluation": ["batch.mixture=online", "batch.online.rule=evaluation"],
    "excess": ["batch.mixture=online", "batch.online.rule=evaluation"],  # + batch.online.reference
}
EVALUATED = ("evaluation", "excess", "reference", "continuation")  # evaluated at every checkpoint while training
FAMILIES = languages.GROUPS


def run_arm(
    arm: str,
    seed: int,
    data: Path,
    out: Path,
    steps: int,
    interval: int,
    eval_tokens: int,
    reference: Path | None = None,
    overrides: list[str] | None = None,
    test: Path | None = None,
    test_items: int = 50,
    into: str = "test",
) -> float:
    """Train one arm with one seed (``reference``: the α run an ``excess`` arm reads; the arm
    ``reference`` is that run; ``overrides``: the arm's recipe values, ARMS' by default) and
    evaluate its final checkpoint: on the data's validation split, or with ``test`` on that
    prepared test data into ``out/<into>`` (bpb and ``test_items`` continuation items per
    language). Returns the training wall seconds (0 when already done)."""
    from training.checkpoint.run_dir import RunDir

    final = RunDir(out if test is None else out / into).results / f"step_{steps:08d}.parquet"
    if final.exists():
        return 0.0
    evaluating = arm in EVALUATED or "batch.online.rule=evaluation" in (overrides or [])
    o = [
        f"train.steps={steps}",
        f"train.seed={seed}",
        f"checkpoint.interval={interval if evaluating else steps}",
        f"evaluation.enabled={str(evaluating).lower()}",
        f"evaluation.settings.max_tokens_per_lang={eval_tokens}",
        "evaluation.settings.prompts_per_lang=0",
        "optim.warmup_steps=20",
        *(ARMS.get(arm, []) if overrides is None else overrides),
    ]
    if reference is not None:
        o.append(f"batch.online.reference={reference}")
    if evaluating:  # at idle priority, or paced to evaluation.cpu_share (0.1 by default), on 2 busy cores the
        # evaluations land only after training has ended (measured: the first at step 293 of 300): steer in time
        o += ["evaluation.idle_priority=false", "evaluation.nice=0", "evaluation.cpu_share=null"]
    args = ["train", "--config", str(REPO / "configs/train/bloom-tiny.yaml"), "--data", str(data), "--out", str(out)]
    for x in o:
        args += ["-o", x]
    out.mkdir(parents=True, exist_ok=True)
    t = time.time()
    if not RunDir(out).step_dir(steps).is_dir():
        cli(*args, log=out / "bench-train.log", DS_ACCELERATOR="cpu")
    wall = time.time() - t
    if not final.exists():  # every arm's final checkpoint alike (an evaluation the watcher left included)
        held = (  # on data no arm has seen or steered by, into a folder of its own
            [
                "--out",
                str(out / into),
                "-o",
                f"heldout={test}",
                "-o",
                f"tasks=[{{name: continuation, limit: {test_items}}}]",
            ]
            if test is not None
            else []
        )
        cli(
            "evaluate",
            "--checkpoint",
            str(RunDir(out).step_dir(steps)),
            "--data",
            str(data),
            *held,
            "-o",
            f"max_tokens_per_lang={eval_tokens}",
            "-o",
            "prompts_per_lang=0",
            log=out / ("bench-test.log" if test is not None else "bench-eval.log"),
            DS_ACCELERATOR="cpu",
        )
    return wall
