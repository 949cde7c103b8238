"""The evaluation of a checkpoint (``bloomline evaluate``) and of every checkpoint while training runs (``evaluation:``)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal, Optional

from bloomline.config import Location, check
from bloomline.task_spec import TaskSpec


@dataclass
class EvalParallelConfig:
    """The layout an evaluation runs in (``parallel:`` of the evaluation settings): tp·pp ranks,
    each holding one pipeline stage's tensor-parallel slice of the model (eval/parallel/)."""

    tp: int = 1
    """Tensor-parallel degree: must divide the model's heads (any checkpoint layout is re-cut)."""
    pp: int = 1
    """Pipeline stages: at most the model's layers; cut as training cuts them."""
    hostfile: Optional[Location] = None
    """A DeepSpeed hostfile (``host slots=N`` lines) whose hosts run the ranks, tp·pp slots in
    all; None: the machine the command runs on."""
    timeout_s: Optional[float] = None
    """An evaluation that runs longer is stopped, every rank killed, and fails with that reason;
    None: no limit."""

    @property
    def world_size(self) -> int:
        return self.tp * self.pp

    def validate(self) -> None:
        check(self.tp >= 1, "tp", "must be >= 1")
        check(self.pp >= 1, "pp", "must be >= 1")
        check(self.timeout_s is None or self.timeout_s > 0, "timeout_s", "must be > 0, or null for no limit")


@dataclass
class EvalConfig:
    """How ``bloomline evaluate`` evaluates a checkpoint (recipes in ``configs/eval/``; eval/)."""

    device: Literal["auto", "cpu", "cuda"] = "auto"
    """Where the model and every task run; auto: the accelerator when one is present. Recorded with
    every result row (``eval_layout``)."""
    precision: Optional[Literal["fp32", "bf16"]] = None
    """Dtype the checkpoint's model is evaluated in (recorded with every result row); None: bf16 on
    a GPU, fp32 on the CPU."""
    parallel: EvalParallelConfig = field(default_factory=EvalParallelConfig)
    """The evaluation's own layout (any checkpoint layout is evaluated in it); tp = pp = 1: this
    process alone."""
    max_tokens_per_lang: Optional[int] = None
    """Evaluate at most this many tokens of each language's validation split (its first samples
    in shard order, the same every round); None: all of it."""
    batch_tokens: int = 16384
    """Padded tokens per forward pass (samples of one bucket are batched together)."""
    prompts_per_lang: int = 2
    """Greedy generations stored per language, from fixed prompts (the first validation documents)."""
    prompt_tokens: int = 16
    """Tokens of each prompt."""
    new_tokens: int = 24
    """Tokens generated per prompt (greedy)."""
    threads: Optional[int] = None
    """torch threads for the evaluation; None: torch's default (all cores)."""
    regression_threshold: float = 0.02
    """A language whose bits per byte rose by more than this since the previous checkpoint is flagged."""
    tasks: list[TaskSpec] = field(default_factory=list)
    """Tasks evaluated beside the validation split's loss and bits per byte (which always run):
    ``[{name: continuation}, {name: xstorycloze, data: DIR}]``."""
    heldout: Optional[Location] = None
    """Other prepared data (``bloomline prepare`` with ``tokenizer.model`` set to the training
    data's tokenizer) whose validation split is evaluated instead of the training data's: a test
    set no run has steered by. Its tokenizer must be the training data's (checked by sha256);
    the results go to their own folder (``bloomline evaluate --out``), never the run's."""

    def validate(self) -> None:
        check(self.max_tokens_per_lang is None or self.max_tokens_per_lang >= 1, "max_tokens_per_lang", "must be >= 1")
        check(self.batch_tokens >= 1, "batch_tokens", "must be >= 1")
        check(self.prompts_per_lang >= 0, "prompts_per_lang", "must be >= 0")
        check(self.prompt_tokens >= 1, "prompt_tokens", "must be >= 1")
        check(self.new_tokens >= 0, "new_tokens", "must be >= 0")
        check(self.threads is None or self.threads >= 1, "threads", "must be >= 1")
        check(self.regression_threshold >= 0, "regression_threshold", "must be >= 0")


@dataclass
class EvaluationConfig:
    """The recipe's ``evaluation``: every checkpoint evaluated while ``bloomline train`` runs
    (flows/stages/watch.py), with ``settings`` as ``bloomline evaluate`` takes them."""

    enabled: bool = True
    """Evaluate each new checkpoint in a separate, lower-priority process (never in the training loop)."""
    settings: EvalConfig = field(default_factory=EvalConfig)
    """What and how to evaluate (configs/eval/); ``settings.threads`` unset means one thread here,
    to leave the cores to training."""
    gpus: Optional[list[int]] = None
    """The GPUs of the training node (CUDA indices) the evaluation may use; None: those no training
    rank of the node uses (the ranks take the first ones), and the CPU when every GPU holds a rank
    (eval/beside.py; ``bloomline plan`` says which). Listing a rank's GPU shares it, memory too."""
    nice: int = 10
    """The evaluation process's niceness (0-19): the scheduler gives training the CPU first."""
    idle_priority: bool = True
    """Run the evaluation process in Linux's idle scheduling class: it gets a core only when
    training leaves one idle (so on a busy machine evaluations may wait for the end of training)."""
    cpu_share: float | None = 0.1
    """While training runs, the evaluation process uses at most this many CPU seconds per wall second
    (flows/run/pace.py): on a machine whose cores training fills, neither ``nice`` nor the idle class
    keeps an evaluation from slowing training, its CPU time does. What the cap defers runs at full
    speed once training ends (within ``drain_s``). None: no cap."""
    max_deferred: int = 2
    """Checkpoints that ``checkpoint.keep`` would delete wait for their evaluation; when more than
    this many wait, the oldest is recorded as skipped (with the reason) and deleted."""
    drain_s: float = 1800.0
    """After training ends, wait this long for the evaluations still to run; those left are recorded as skipped."""

    def validate(self) -> None:
        check(0 <= self.nice <= 19, "nice", "must be in [0, 19]")
        check(self.cpu_share is None or self.cpu_share > 0, "cpu_share", "must be > 0, or null for no cap")
        check(self.max_deferred >= 0, "max_deferred", "must be >= 0")
        check(self.drain_s >= 0, "drain_s", "must be >= 0")


# BLOOM-176B's NCCL setting (tr11-176B-ml.slurm): "force crashing on nccl issues like hanging
# broadcast" — a hung collective becomes an error the restart loop can act on, not a stalled job.
