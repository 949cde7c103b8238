"""The online mixture as the trainer runs it (``batch.mixture: online``): what feeds the
controller (training/data/mixture/controller.py), where its decisions are recorded, and how a resumed run
replays them.

Inputs, without a collective of their own and without waiting:

* the step's per-language Σ token loss and labelled tokens (training/loop/loss.py ``StepLoss``), in
  the columns of the one row per rank that the trainer all-gathers after every step anyway;
* with the ``evaluation`` rule, the evaluations that have landed: the evaluation of each
  checkpoint writes ``RUN_DIR/mixture/feedback/step_N.json`` (:func:`write_feedback`, called by
  eval/publish.py). Rank 0 looks for a newer one after each step and, if there is one, puts its
  values in its row of the same all-gather, so every rank applies the same numbers at the same
  step, and no rank reads a file that another might see differently. Nothing waits for it.

Records: every decision is appended to ``RUN_DIR/mixture.jsonl`` (rank 0) *before* the sampler
applies it: ``{"step", "weights", "cause", "inputs"}``, ``weights`` null when results were taken
in without a change, ``inputs`` the evaluation numbers the decision read (null for the bandit).
The controller's state goes into every checkpoint (contract 2, ``mixture``).

Resume: the controller's state comes back from the checkpoint at step k; the bandit's later
decisions are recomputed from the same losses. Evaluation results arrive when they arrive, so a
resumed run must not decide from what happens to be on disk now: the log's evaluation decisions
after step k are replayed at their steps with their recorded inputs, and results are looked for
again only after the last of them. The log is then cut back to step k and rewritten as the run
goes, so it ends equal to an uninterrupted run's.
"""

from __future__ import annotations

import json
import math
import os
import re
import zlib
from pathlib import Path
from typing import Any, Optional

import numpy as np

from bloomline.errors import ConfigError, DataError
from bloomline.io import read_json, write_json_atomic
from training.checkpoint.run_dir import RunDir
from training.data.mixture.controller import Change, MixtureController, OnlineMixtureConfig, ReferenceCurve
from training.data.mixture.log import MixtureLog, read_log
from training.data.sampler import DynamicBatchSampler

FEEDBACK_VERSION = 2
"""Version 2 adds ``continuation`` and ``continuation_n`` (the continuation task's accuracy per
language, and its items); a version 1 file (no such fields) is read as having none."""
MIN_ITEMS = 20
"""The continuation signal reads a language's accuracy only over at least this many items:
with fewer, one item moves it by 5% or more and its standard error (about 0.1 at 20 items)
swamps the progress it is meant to show. A language with fewer is unmeasured (no push)."""
REFERENCE_VERSION = 1
_FEEDBACK = re.compile(r"step_(\d+)\.json")


# ----------------------------------------------------------------------------- feedback files
def write_feedback(
    run_dir: str | Path,
    step: int,
    bpb: dict[str, float],
    tokens_seen: dict[str, int],
    continuation: Optional[dict[str, tuple[float, int]]] = None,
) -> Path:
    """One checkpoint's per-language held-out bpb, training tokens seen and, where the evaluation
    ran the ``continuation`` task, its (accuracy, items) per language scored, for the mixture to read."""
    path = RunDir(Path(run_dir)).mixture_feedback / f"step_{step:08d}.json"
    write_json_atomic(
        path,
        {
            "version": FEEDBACK_VERSION,
            "step": int(step),
            "bpb": {k: float(v) for k, v in sorted(bpb.items())},
            "tokens_seen": {k: int(v) for k, v in sorted(tokens_seen.items())},
            "continuation": {k: float(a) for k, (a, _) in sorted((continuation or {}).items())},
            "continuation_n": {k: int(n) for k, (_, n) in sorted((continuation or {}).items())},
        },
        durable=False,
    )
    return path


def signal_values(fb: dict[str, Any], signal: str) -> dict[str, float]:
    """The measure an evaluation-steered mixture reads from a feedback file, lower is better:
    ``bpb`` as is; ``continuation``, the error rate 1 − acc of each language the task scored
    over at least MIN_ITEMS items."""
    if signal == "bpb":
        return dict(fb["bpb"])
    n = fb.get("continuation_n") or {}
    return {k: 1.0 - float(v) for k, v in (fb.get("continuation") or {}).items() if n.get(k, 0) >= MIN_ITEMS}


def newest_feedback(run: RunDir) -> Optional[Path]:
    """The feedback file of the newest evaluated checkpoint (None: none yet)."""
    try:
        names = os.listdir(run.mixture_feedback)
    except FileNotFoundError:
        return None
    steps = [int(m.group(1)) for n in names if (m := _FEEDBACK.fullmatch(n))]
    return run.mixture_feedback / f"step_{max(steps):08d}.json" if steps else None


def drop_feedback_after(run: RunDir, step: int) -> list[int]:
    """Remove the feedback files of checkpoints after ``step`` (a run resumed from ``step`` replaces
    them; read now, they would steer its next steps by evaluations from a future it redoes)."""
    try:
        names = os.listdir(run.mixture_feedback)
    except FileNotFoundError:
        return []
    dropped = sorted(int(m.group(1)) for n in names if (m := _FEEDBACK.fullmatch(n)) and int(m.group(1)) > step)
    for s in dropped:
        (run.mixture_feedback / f"step_{s:08d}.json").unlink(missing_ok=True)
    return dropped


def read_feedback(path: Path) -> dict[str, Any]:
    fb = read_json(path)
    if fb.get("version") not in (1, FEEDBACK_VERSION):
        raise DataError(f"{path}: feedback version {fb.get('version')}, this bloomline reads 1 to {FEEDBACK_VERSION}")
    return fb


# --------------------------------------------------------------------------- the reference run
def write_reference(run_dir: str | Path, curve: ReferenceCurve, checked: dict[str, Any]) -> Path:
    """The reference run's per-language curve, as this run's trainer reads it (written at start
    by the flow, which read the reference's results table and checked it against this run:
    ``checked`` says what was compared)."""
    path = RunDir(Path(run_dir)).mixture_reference
    write_json_atomic(
        path,
        {
            "version": REFERENCE_VERSION,
            "run": curve.run,
            "checked": checked,
            "points": {k: [[int(t), float(b)] for t, b in v] for k, v in sorted(curve.points.items())},
        },
    )
    return path


def read_reference(run: RunDir) -> ReferenceCurve:
    path = run.mixture_reference
    if not path.is_file():
        raise ConfigError(
            "batch.online.reference",
            f"{path} is missing: start the run with `bloomline train`, which "
            "reads the reference run's results and writes it",
        )
    ref = read_json(path)
    if ref.get("version") != REFERENCE_VERSION:
        raise DataError(f"{path}: version {ref.get('version')}, this bloomline reads {REFERENCE_VERSION}")
    return ReferenceCurve(ref["run"], {k: [(int(t), float(b)) for t, b in v] for k, v in ref["points"].items()})


# ------------------------------------------------------------------------------- the runtime
class OnlineMixture:
    """One rank's controller, fed after every step; rank 0 also writes the decisions' log.

    ``row()`` is what this rank adds to the step's all-gather; ``after_step`` takes the summed
    language columns and rank 0's feedback columns and returns the decisions made."""

    def __init__(self, cfg: OnlineMixtureConfig, run: RunDir, sampler: DynamicBatchSampler, rank: int):
        self.cfg, self.run, self.sampler, self.rank = cfg, run, sampler, rank
        self.log = MixtureLog(run, rank)
        self.languages = sorted(sampler.weights)
        if cfg.rule == "evaluation":
            valid = {s["lang"] for s in sampler.index.manifest["shards"] if s["split"] == "valid"}
            blind = [lang for lang in self.languages if lang not in valid]
            if blind:
                more = f" and {len(blind) - 5} more" if len(blind) > 5 else ""
                raise ConfigError(
                    "batch.online.rule",
                    f"evaluation steers by each language's held-out bpb, but "
                    f"{', '.join(blind[:5])}{more} have no validation data in "
                    f"{sampler.index.data_dir}",
                )
        reference = read_reference(run) if cfg.reference else None  # checked at start (eval/results/reference.py)
        self.controller = MixtureController(
            cfg, self.languages, np.array([sampler.weights[l] for l in self.languages]), reference
        )
        self.scheduled: dict[int, dict[str, Any]] = {}  # step → recorded evaluation inputs to replay
        self.unusable = -1  # the newest feedback that lacked a language (not read again)
        self.sampler.set_weights(self.controller.blend())

    @property
    def k(self) -> int:
        return len(self.languages)

    @property
    def _key(self) -> str:
        """The recorded inputs' name for the signal's measure (mixture.jsonl ``inputs``)."""
        return "bpb" if self.cfg.signal == "bpb" else "continuation_error"

    def fingerprint(self) -> int:
        """crc32 of the weights the sampler draws from: the trainer checks that every rank has the same."""
        return zlib.crc32(json.dumps(self.sampler.weights, sort_keys=True).encode())

    def start(self, step: int) -> Optional[Change]:
        """The bounded starting weights, recorded as step 0's decision (a fresh run only)."""
        if step:
            return None
        c = Change(0, self.controller.blend(), {"rule": "start", "signal": "the data's blend within min/max_weight"})
        self.log.record(c)
        return c

    def row(self, step: int) -> list[float]:
        """Rank 0: ``[checkpoint, measure × K, tokens seen × K]`` of an evaluation newer than the
        last applied one (the signal's measure: bpb, or the continuation error rate, NaN where the
        task skipped the language; checkpoint −1: none, or replaying); other ranks: −1 and zeros."""
        empty = [-1.0] + [0.0] * (2 * self.k)
        if self.rank != 0 or self.cfg.rule != "evaluation" or step < self.cfg.warmup_steps:
            return empty
        if any(s >= step for s in self.scheduled):
            return empty  # replaying: decisions come from the log until its last one
        path = newest_feedback(self.run)
        last = self.controller.last_eval["checkpoint"] if self.controller.last_eval else -1
        if path is None or int(_FEEDBACK.fullmatch(path.name).group(1)) <= max(last, self.unusable):
            return empty
        fb = read_feedback(path)
        values = signal_values(fb, self.cfg.signal)
        missing = [l for l in self.languages if not math.isfinite(values.get(l, math.nan))]
        # bpb must cover every language (each has validation data: checked at start); the
        # continuation task skips a language with too few windows, which then gets no push
        if (missing and self.cfg.signal == "bpb") or len(missing) == self.k:
            self.unusable = int(fb["step"])
            what = "bpb" if self.cfg.signal == "bpb" else "continuation accuracy"
            print(f"mixture: the evaluation of step {fb['step']} has no {what} for {missing[:8]}; not used", flush=True)
            return empty
        return (
            [float(fb["step"])]
            + [float(values.get(l, math.nan)) for l in self.languages]
            + [float(fb["tokens_seen"].get(l, 0)) for l in self.languages]
        )

    def after_step(
        self, step: int, lang_loss: np.ndarray, lang_tokens: np.ndarray, feedback: np.ndarray, measured: bool
    ) -> list[Change]:
        """Feed step ``step``'s totals (``measured`` False for a skipped batch: its losses are not
        fed) and rank 0's feedback row; record and apply what the controller decides."""
        changes: list[tuple[Change, Optional[dict[str, Any]]]] = []
        if measured and (c := self.controller.observe_losses(step, lang_loss, lang_tokens)) is not None:
            changes.append((c, None))
        inputs = self.scheduled.pop(step, None)
        if inputs is None and feedback[0] >= 0:
            values = zip(self.languages, map(float, feedback[1 : 1 + self.k]))
            inputs = {
                "checkpoint": int(feedback[0]),
                self._key: {l: v for l, v in values if math.isfinite(v)},
                "tokens_seen": dict(zip(self.languages, map(int, feedback[1 + self.k :]))),
            }
        if inputs is not None:
            c = self.controller.observe_results(step, inputs["checkpoint"], inputs[self._key], inputs["tokens_seen"])
            if c is not None:
                changes.append((c, inputs))
        for c, inp in changes:
            self.log.record(c, inp)
        if any(c.weights is not None for c, _ in changes):
            self.sampler.set_weights(self.controller.blend())
        return [c for c, _ in changes]

    # --------------------------------------------------------------------------- checkpoint
    def state_dict(self) -> dict[str, Any]:
        return self.controller.state_dict()

    def resume(self, state: Optional[dict[str, Any]], step: int) -> None:
        """Restore the state saved at ``step`` and schedule the log's later evaluation decisions.
        Every rank reads the log here; :meth:`cut_log` (rank 0, after a barrier) then cuts it."""
        if state is None:
            raise ConfigError(
                "batch.mixture",
                f"the checkpoint at step {step} was trained with a fixed mixture; "
                f"an online mixture starts with a fresh run",
            )
        self.controller.load_state_dict(state)
        self.sampler.set_weights(self.controller.blend())
        self.scheduled = {
            e["step"]: e["inputs"] for e in read_log(self.run) if e["step"] > step and e["inputs"] is not None
        }

    def cut_log(self, step: int) -> None:
        self.log.cut(step)
