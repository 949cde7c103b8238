"""Typed configuration of ``bloomline train`` (recipes in ``configs/model/`` and ``configs/train/``).

A training recipe (``configs/train/*.yaml``) is a :class:`TrainRecipe`: the model, how it is
parallelised, the optimisation, the dynamic batches and checkpointing. ``model:`` may name a
file in ``configs/model/`` (``model: bloom-tiny``) or spell the model out inline.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal, Optional, Union

from bloomline.config import check
from bloomline.errors import ConfigError
from bloomline.task_spec import TaskSpec

DATA_SHAPED = ("vocab_size", "seq_len")
"""The model's values that may be left to the prepared data (None): :meth:`ModelConfig.fit_to_data`."""


@dataclass
class ModelConfig:
    vocab_size: Optional[int] = 250_680
    """The tokenizer's vocabulary size, before padding (BLOOM: 250,680); the data's manifest must
    give the same (``data_prep.shards.check_model_fits``). None: the prepared data's tokenizer's
    (:meth:`fit_to_data`; ``bloomline pipeline`` leaves it to the data unless its recipe sets it)."""
    hidden_size: int = 1024
    """Width of the residual stream."""
    num_layers: int = 24
    """Transformer blocks."""
    num_heads: int = 16
    """Attention heads (ALiBi slopes are per head)."""
    seq_len: Optional[int] = 2048
    """Longest sample (the data's largest bucket must not exceed it). None: the data's largest
    bucket (:meth:`fit_to_data`)."""
    ffn_mult: int = 4
    """MLP width = ffn_mult × hidden_size (BLOOM: 4)."""
    layernorm_eps: float = 1e-5
    """LayerNorm epsilon."""
    init_std: float = 0.0048
    """Std of the normal weight init (BLOOM-176B: 0.0048, ≈ sqrt(1/(3·hidden)) for hidden 14336)."""
    attention: Literal["auto", "sdpa", "flex"] = "auto"
    """Attention kernel: ``sdpa`` (dense ALiBi + document bias, the reference; trains everywhere),
    ``flex`` (FlexAttention, block-sparse over documents, training/model/attention.py; no CPU backward in
    torch 2.13, so CPU training needs sdpa), or ``auto``: the trainer times one block's step with
    each kernel that can train here on a micro-batch of the data and takes the faster (on CPU:
    sdpa, the only one); evaluation and export read ``auto`` as sdpa. The same function either way."""
    make_vocab_divisible_by: int = 128
    """Without pad_vocab_to, the embedding is padded to a multiple of this × TP (Megatron's rule)."""
    pad_vocab_to: Optional[int] = None
    """Pad the embedding to exactly this many rows at every TP (Megatron-DeepSpeed's
    ``--pad-vocab-size-to``, which BigScience used for the smaller BLOOMs: 250,880 rows, the size in
    their published configs); must split over TP. None: Megatron's rule above."""

    def validate(self) -> None:
        for k in (
            "vocab_size",
            "hidden_size",
            "num_layers",
            "num_heads",
            "seq_len",
            "ffn_mult",
            "make_vocab_divisible_by",
        ):
            check(getattr(self, k) is None and k in DATA_SHAPED or (getattr(self, k) or 0) >= 1, k, "must be >= 1")
        check(
            self.hidden_size % self.num_heads == 0,
            "hidden_size",
            f"{self.hidden_size} is not divisible by num_heads={self.num_heads}",
        )
        if self.vocab_size is None:
            return  # the pad_vocab_to checks wait for the data's vocabulary (fit_to_data)
        check(
            self.pad_vocab_to is None or self.pad_vocab_to >= self.vocab_size,
            "pad_vocab_to",
            f"{self.pad_vocab_to} is smaller than vocab_size={self.vocab_size}",
        )
        # pad_vocab_to fixes the table of a known tokenizer (BLOOM-560m: 250,880 rows for 250,680
        # pieces); kept after vocab_size changed to another tokenizer's, it would silently compute
        # and count thousands of padding logits per token.
        check(
            self.pad_vocab_to is None or self.pad_vocab_to - self.vocab_size < 8 * self.make_vocab_divisible_by,
            "pad_vocab_to",
            f"{self.pad_vocab_to} rows for a {self.vocab_size}-piece tokenizer would be "
            f"{(self.pad_vocab_to or 0) - self.vocab_size} rows of padding: set model.pad_vocab_to=null to pad by "
            f"Megatron's rule, or to the size this tokenizer's table should have",
        )

    def fit_to_data(self, vocab_size: int, largest_bucket: int) -> list[str]:
        """Fill what the recipe left to the data (None): the vocabulary from the data's tokenizer
        (the embedding then padded by ``make_vocab_divisible_by``), the sequence length from its
        largest bucket. Returns one line per value derived. Values the recipe set stay as set:
        ``data_prep.shards.check_model_fits`` refuses one that contradicts the data."""
        said = []
        if self.vocab_size is None:
            self.vocab_size = vocab_size
            said.append(
                f"model.vocab_size = {vocab_size} (the prepared tokenizer's; {self.padded_vocab()} embedding rows)"
            )
        if self.seq_len is None:
            self.seq_len = largest_bucket
            said.append(f"model.seq_len = {largest_bucket} (the data's largest bucket)")
        if said:
            self.validate()
        return said

    def padded_vocab(self, tp: int = 1) -> int:
        """Rows of the embedding table at tensor-parallel degree ``tp`` (padding rows are masked,
        so the model is the same function at any padding)."""
        if self.pad_vocab_to is not None:
            return self.pad_vocab_to
        if self.vocab_size is None:
            raise ConfigError("model.vocab_size", "left to the data, but no data was given to take it from")
        m = self.make_vocab_divisible_by * tp
        return ((self.vocab_size + m - 1) // m) * m

    @property
    def head_dim(self) -> int:
        return self.hidden_size // self.num_heads


@dataclass
class ParallelConfig:
    """How the model is spread over ranks (torchtitan-style: one validated place).

    Rank order is Megatron/DeepSpeed's: tp varies fastest, then dp, then pp."""

    tp: int = 1
    """Tensor-parallel degree (megatron-core Column/RowParallelLinear, VocabParallelEmbedding)."""
    pp: int = 1
    """Pipeline stages (DeepSpeed PipelineModule, partitioned by transformer layers)."""
    dp: int = 1
    """Data-parallel replicas."""
    zero_stage: int = 1
    """ZeRO stage for data parallelism: 0-3 without PP, 0-1 with PP."""
    backend: Literal["auto", "gloo", "nccl"] = "auto"
    """torch.distributed backend; auto: nccl on GPUs, gloo on CPU."""

    def validate(self) -> None:
        for k in ("tp", "pp", "dp"):
            check(getattr(self, k) >= 1, k, "must be >= 1")
        check(0 <= self.zero_stage <= 3, "zero_stage", "must be 0, 1, 2 or 3")
        check(
            not (self.pp > 1 and self.zero_stage > 1),
            "zero_stage",
            f"ZeRO stage {self.zero_stage} cannot be combined with pipeline parallelism (pp={self.pp}): stages 2 and 3 "
            "partition gradients/parameters across data-parallel ranks while the pipeline accumulates gradients over "
            "micro-batches, which DeepSpeed refuses. Use zero_stage 0 or 1 with pp > 1.",
        )

    @property
    def world_size(self) -> int:
        return self.tp * self.pp * self.dp

    def check_world(self, world_size: int) -> None:
        if self.world_size != world_size:
            raise ConfigError(
                "parallel",
                f"tp·pp·dp = {self.tp}·{self.pp}·{self.dp} = {self.world_size} does not match "
                f"the world size {world_size}",
            )

    def check_model(self, model: ModelConfig) -> None:
        if model.num_heads % self.tp:
            raise ConfigError("parallel.tp", f"num_heads={model.num_heads} is not divisible by tp={self.tp}")
        if model.hidden_size % self.tp:
            raise ConfigError("parallel.tp", f"hidden_size={model.hidden_size} is not divisible by tp={self.tp}")
        if model.vocab_size is not None and model.padded_vocab(self.tp) % self.tp:
            raise ConfigError("model.pad_vocab_to", f"{model.pad_vocab_to} rows do not split over tp={self.tp}")
        if model.num_layers < self.pp:
            raise ConfigError(
                "parallel.pp",
                f"pp={self.pp} pipeline stages need at least {self.pp} layers, the model has {model.num_layers}",
            )


@dataclass
class OnlineMixtureConfig:
    """``batch.online``: how an online mixture moves the language weights (training/data/mixture.py)."""

    rule: Literal["bandit", "evaluation"] = "bandit"
    """``bandit``: exponential weights over the smoothed per-language training loss (Online Data
    Mixing, Albalak et al. 2023, arXiv 2312.02406). ``evaluation``: each checkpoint's held-out
    bits per byte, excess over a reference run (DoReMi, Xie et al. 2023, arXiv 2305.10429) or,
    without one, each language's learning progress."""
    every: int = 10
    """bandit: update the weights every this many steps, from the losses of those steps (ODM
    updates every step; a few steps of a small batch give each language enough tokens to measure)."""
    warmup_steps: int = 20
    """No change before this step: early losses fall for every language and say little (ODM warms
    up 2,000 of its 1B model's steps on the initial weights)."""
    eta: float = 1.0
    """Step size of the exponential update, per nat of loss (bandit) or per bit per byte
    (evaluation). DoReMi uses 1; its authors advise 0.1 when weights collapse (doremi#5)."""
    loss_smoothing: float = 0.5
    """bandit: each language's reward is an exponential moving average of its loss, the old
    value kept with this factor (ODM's α: 0.9 in its code, 0.5 in its 1B runs)."""
    explore: bool = False
    """bandit: mix the target with uniform by EXP3's ε_t = min(1/K, sqrt(ln K / (K·t))), t the
    number of updates (ODM, section 3). Off by default: EXP3 explores because a bandit sees one
    arm's loss per round, while the trainer measures every language it drew (full information,
    Hedge); and with BLOOM's K = 59 languages, ε_t = 1/K (the target exactly uniform) for the
    first K·ln K ≈ 240 updates."""
    smoothing: float = 0.5
    """Each change moves the weights this fraction of the way to the rule's target (1: jump)."""
    min_weight: float = 0.002
    """No language's weight goes below this (every language keeps being trained and measured)."""
    max_weight: float = 0.5
    """No language's weight goes above this."""
    reference: Optional[str] = None
    """evaluation: another bloomline run's folder (RUN_DIR) whose per-language results are the
    reference, read at equal tokens of each language seen (DoReMi's reference model; a small
    proxy run will do). Its languages, tokenizer and validation data must be this run's."""

    def validate(self) -> None:
        check(self.every >= 1, "every", "must be >= 1")
        check(self.warmup_steps >= 0, "warmup_steps", "must be >= 0")
        check(self.eta > 0 and math.isfinite(self.eta), "eta", "must be > 0")
        check(0 <= self.loss_smoothing < 1, "loss_smoothing", "must be in [0, 1)")
        check(0 < self.smoothing <= 1, "smoothing", "must be in (0, 1]")
        check(0 <= self.min_weight < 1, "min_weight", "must be in [0, 1)")
        check(0 < self.max_weight <= 1, "max_weight", "must be in (0, 1]")
        check(self.min_weight <= self.max_weight, "min_weight", f"must be <= max_weight={self.max_weight}")
        check(
            self.reference is None or self.rule == "evaluation",
            "reference",
            "only the evaluation rule reads a reference run",
        )

    def check_languages(self, n: int) -> None:
        """Floors and ceilings must admit a blend of ``n`` languages: n·min ≤ 1 ≤ n·max."""
        if n * self.min_weight > 1:
            raise ConfigError(
                "batch.online.min_weight",
                f"{n} languages × min_weight {self.min_weight} = "
                f"{n * self.min_weight:.3g} > 1: no blend has that floor; "
                f"lower it to at most {1 / n:.4g}",
            )
        if n * self.max_weight < 1:
            raise ConfigError(
                "batch.online.max_weight",
                f"{n} languages × max_weight {self.max_weight} = "
                f"{n * self.max_weight:.3g} < 1: no blend has that ceiling; "
                f"raise it to at least {1 / n:.4g}",
            )


@dataclass
class BatchConfig:
    """Dynamic batches: a token budget per step, one length bucket per step."""

    tokens_per_step: int = 2048 * 2048
    """Global token budget of one optimizer step (BLOOM-176B: 2048 samples × 2048 tokens)."""
    micro_batch_tokens: int = 8192
    """Tokens (padded) of one micro-batch on one rank: samples per micro-batch = this // bucket."""
    rampup_start_tokens: Optional[int] = None
    """Batch-size ramp-up: start at this budget (BLOOM: 192 × 2048); None: no ramp-up."""
    rampup_increment_tokens: int = 16 * 2048
    """Ramp-up increment (BLOOM: 16 samples)."""
    rampup_tokens: int = 0
    """Tokens consumed over which the budget grows to tokens_per_step (BLOOM: 20M samples)."""
    lr_scaling: Literal["none", "linear", "sqrt"] = "linear"
    """Scale the LR by the step's actual batch tokens / tokens_per_step (DeepSpeed's
    variable-batch-size-and-LR): linear, square root, or not at all."""
    attn_weight: Optional[float] = None
    """Cost of one attended (query, key) pair, in padded positions, in the cost the sampler
    balances ranks by: padded length + attn_weight·Σ dᵢ(dᵢ+1)/2 over the sample's documents.
    None: the model's FLOPs ratio 12·L·H / 6·N (training/planning/flops.py; bloom-560m 8.8e-5)."""
    balance_tolerance: float = 0.02
    """Data-parallel ranks' cost (above) must be within this of the step's mean."""
    mixture: Literal["fixed", "online"] = "fixed"
    """The language blend while training runs: ``fixed`` samples every step from the starting
    blend (the data's manifest: BLOOM's α-smoothed weights, or ``blend.weights``); ``online`` lets
    ``batch.online``'s rule move it at step boundaries (training/data/mixture.py)."""
    online: OnlineMixtureConfig = field(default_factory=OnlineMixtureConfig)
    """The rule and its settings, with ``mixture: online``."""

    def validate(self) -> None:
        check(self.tokens_per_step >= 1, "tokens_per_step", "must be >= 1")
        check(self.micro_batch_tokens >= 1, "micro_batch_tokens", "must be >= 1")
        check(
            self.rampup_start_tokens is None or 1 <= self.rampup_start_tokens <= self.tokens_per_step,
            "rampup_start_tokens",
            "must be between 1 and tokens_per_step",
        )
        check(self.rampup_increment_tokens >= 1, "rampup_increment_tokens", "must be >= 1")
        check(self.rampup_tokens >= 0, "rampup_tokens", "must be >= 0")
        check(self.attn_weight is None or self.attn_weight >= 0, "attn_weight", "must be >= 0")
        check(0 < self.balance_tolerance < 1, "balance_tolerance", "must be in (0, 1)")


@dataclass
class OptimConfig:
    lr: float = 6e-5
    """Peak learning rate (BLOOM-176B: 6e-5)."""
    min_lr: float = 6e-6
    """Floor of the cosine decay (BLOOM-176B: 6e-6)."""
    warmup_steps: int = 375
    """Linear warm-up steps."""
    decay_steps: Optional[int] = None
    """Cosine decay length in steps; None: until train.steps."""
    beta1: float = 0.9
    """Adam β1."""
    beta2: float = 0.95
    """Adam β2 (BLOOM: 0.95)."""
    eps: float = 1e-8
    """Adam epsilon."""
    weight_decay: float = 0.1
    """AdamW weight decay (not on biases and LayerNorms)."""
    clip_grad: float = 1.0
    """Global gradient-norm clipping (BLOOM: 1.0)."""

    def validate(self) -> None:
        check(self.lr > 0, "lr", "must be > 0")
        check(0 <= self.min_lr <= self.lr, "min_lr", f"must be between 0 and lr={self.lr}")
        check(self.warmup_steps >= 0, "warmup_steps", "must be >= 0")
        check(
            self.decay_steps is None or self.decay_steps > self.warmup_steps,
            "decay_steps",
            f"must be larger than warmup_steps={self.warmup_steps} (the cosine runs from the end of warm-up "
            "to decay_steps), or null to decay until train.steps",
        )
        check(0 <= self.beta1 < 1, "beta1", "must be in [0, 1)")
        check(0 <= self.beta2 < 1, "beta2", "must be in [0, 1)")
        check(self.eps > 0, "eps", "must be > 0")
        check(self.weight_decay >= 0, "weight_decay", "must be >= 0")
        check(self.clip_grad >= 0, "clip_grad", "must be >= 0")


@dataclass
class TrainLoopConfig:
    steps: int = 100
    """Optimizer steps to train for."""
    precision: Literal["bf16", "fp16", "fp32"] = "bf16"
    """bf16 (BLOOM), fp16 with dynamic loss scaling, or fp32."""
    cpu_fp16: bool = False
    """Allow fp16 on a CPU without fp16 kernels (DeepSpeed refuses it there): torch's reference
    half-precision kernels run it, slowly. For testing the fp16 path on CPU machines only."""
    fp16_initial_scale_power: int = 16
    """fp16 dynamic loss scaling starts at 2**this (DeepSpeed's and Megatron's default 16)."""
    fp16_loss_scale_window: int = 1000
    """Double the loss scale after this many steps without overflow (Megatron's default)."""
    fp16_hysteresis: int = 2
    """Overflows tolerated before the scale is halved (Megatron's default 2)."""
    fp16_min_loss_scale: float = 1.0
    """The scale never drops below this; an overflow at the minimum stops the job."""
    activation_checkpointing: bool = True
    """Recompute each block's activations in the backward pass (memory for compute)."""
    compile: bool = False
    """``torch.compile`` each transformer block (after TP and activation checkpointing, as
    torchtitan does). Off by default: measured slower on this CPU (bench/compile.py); the GPU check
    measures it on a GPU."""
    seed: int = 1234
    """Seed of initialisation, dropout-free training and the sampler."""
    skip_spike_factor: float = 0.0
    """Skip a batch whose loss exceeds this × the running mean loss (0: off); NaN/inf always skip."""
    max_skipped_in_a_row: int = 20
    """Stop with an error after this many skipped batches in a row."""
    log_interval: int = 1
    """Print a progress line (step, loss, LR, tokens/s) every this many steps; metrics.jsonl and
    TensorBoard get every step regardless."""
    inject_nan_at: list[int] = field(default_factory=list)
    """Fault drill: the loss of these steps is made NaN, to check end to end that bad batches are
    skipped and reported (``skip_reason: bad_loss``). Empty in real runs."""

    def validate(self) -> None:
        check(self.steps >= 1, "steps", "must be >= 1")
        check(self.log_interval >= 1, "log_interval", "must be >= 1")
        check(self.max_skipped_in_a_row >= 0, "max_skipped_in_a_row", "must be >= 0")
        check(self.skip_spike_factor == 0 or self.skip_spike_factor > 1, "skip_spike_factor", "0 (off) or > 1")
        check(0 <= self.fp16_initial_scale_power <= 64, "fp16_initial_scale_power", "must be in [0, 64]")
        check(self.fp16_loss_scale_window >= 1, "fp16_loss_scale_window", "must be >= 1")
        check(self.fp16_hysteresis >= 1, "fp16_hysteresis", "must be >= 1")
        check(self.fp16_min_loss_scale > 0, "fp16_min_loss_scale", "must be > 0")


@dataclass
class CheckpointConfig:
    interval: int = 100
    """Save every this many steps (and at the end)."""
    keep: int = 3
    """Keep the newest this many checkpoints."""
    max_restarts: int = 3
    """The train flow restarts a failed job from `latest` at most this many times."""

    def validate(self) -> None:
        check(self.interval >= 1, "interval", "must be >= 1")
        check(self.keep >= 1, "keep", "must be >= 1")
        check(self.max_restarts >= 0, "max_restarts", "must be >= 0")


@dataclass
class EvalConfig:
    """How ``bloomline evaluate`` evaluates a checkpoint (recipes in ``configs/eval/``; eval/)."""

    precision: Literal["fp32", "bf16"] = "fp32"
    """Dtype the checkpoint's model is evaluated in (recorded with every result row)."""
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
    (flows/watch.py), with ``settings`` as ``bloomline evaluate`` takes them."""

    enabled: bool = True
    """Evaluate each new checkpoint in a separate, lower-priority process (never in the training loop)."""
    settings: EvalConfig = field(default_factory=EvalConfig)
    """What and how to evaluate (configs/eval/); ``settings.threads`` unset means one thread here,
    to leave the cores to training."""
    nice: int = 10
    """The evaluation process's niceness (0-19): the scheduler gives training the CPU first."""
    idle_priority: bool = True
    """Run the evaluation process in Linux's idle scheduling class: it gets a core only when
    training leaves one idle (so on a busy machine evaluations may wait for the end of training)."""
    cpu_share: float | None = 0.1
    """While training runs, the evaluation process uses at most this many CPU seconds per wall second
    (flows/pace.py): on a machine whose cores training fills, neither ``nice`` nor the idle class
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
BLOOM_NCCL_ENV = {"NCCL_ASYNC_ERROR_HANDLING": "1"}
LAUNCHERS = ("pdsh", "openmpi", "slurm", "mpich", "impi", "mvapich")


@dataclass
class LaunchConfig:
    """Where the ranks run: one node (default) or several, started by DeepSpeed's launcher
    (docs: README, "Training on several nodes"). Not part of what a run computes: the same run
    may resume on other machines."""

    hostfile: Optional[str] = None
    """DeepSpeed hostfile (``host slots=N`` per line); None: this machine, tp·pp·dp local ranks."""
    launcher: str = "pdsh"
    """How DeepSpeed reaches the other nodes: pdsh (ssh), openmpi, slurm (srun), mpich, impi, mvapich."""
    launcher_args: str = ""
    """Extra arguments for that launcher (``srun``'s ``--partition=...``, ``mpirun``'s ``--bind-to none``)."""
    master_addr: Optional[str] = None
    """Address of the first node, where rank 0's rendezvous listens; None: the hostfile's first host
    (DeepSpeed asks it over ssh), 127.0.0.1 on one node."""
    master_port: Optional[int] = None
    """Rendezvous port; None: a free port on one node, 29500 on several (every node must use the same)."""
    no_ssh: bool = False
    """Start only this node's ranks (``node_rank``); run the same command on every node (no ssh needed)."""
    node_rank: int = 0
    """This node's index in the hostfile, with ``no_ssh``."""
    nccl: dict[str, str] = field(default_factory=lambda: dict(BLOOM_NCCL_ENV))
    """NCCL_* variables set for every rank on every node (DeepSpeed's launcher exports them); BLOOM's by default."""

    def validate(self) -> None:
        check(self.launcher in LAUNCHERS, "launcher", f"'{self.launcher}': use one of {', '.join(LAUNCHERS)}")
        check(
            all(k.startswith("NCCL_") for k in self.nccl),
            "nccl",
            f"only NCCL_* variables belong here, got {sorted(k for k in self.nccl if not k.startswith('NCCL_'))}",
        )
        check(self.master_port is None or 0 < self.master_port < 65536, "master_port", "must be in 1..65535")
        check(self.node_rank >= 0, "node_rank", "must be >= 0")
        check(not self.no_ssh or self.hostfile is not None, "no_ssh", "needs a hostfile (which node is which)")


@dataclass
class TrainRecipe:
    model: Union[str, ModelConfig] = "bloom-tiny"
    """A recipe name in configs/model/ or the model spelled out."""
    parallel: ParallelConfig = field(default_factory=ParallelConfig)
    """TP × PP × DP layout."""
    batch: BatchConfig = field(default_factory=BatchConfig)
    """Dynamic batches."""
    optim: OptimConfig = field(default_factory=OptimConfig)
    """AdamW and the LR schedule."""
    train: TrainLoopConfig = field(default_factory=TrainLoopConfig)
    """The loop."""
    checkpoint: CheckpointConfig = field(default_factory=CheckpointConfig)
    """Checkpoints and restarts."""
    evaluation: EvaluationConfig = field(default_factory=EvaluationConfig)
    """Per-language evaluation of every checkpoint, alongside training."""
    launch: LaunchConfig = field(default_factory=LaunchConfig)
    """Which machines run the ranks, and the NCCL settings they get."""

    @staticmethod
    def model_recipe(name: str, base: Path) -> Path:
        for c in (base / name, base.parent / "model" / f"{name}.yaml", MODEL_DIR / f"{name}.yaml"):
            if c.is_file():
                return c
        raise ConfigError("model", f"no model recipe '{name}' (looked in {MODEL_DIR})")

    @classmethod
    def expand_raw(cls, raw: dict[str, Any], base: Path) -> dict[str, Any]:
        """Replace ``model: <name>`` by that recipe's keys, so ``-o model.hidden_size=...`` works."""
        import yaml

        name = raw.get("model", "bloom-tiny")
        if isinstance(name, str):
            raw = dict(raw)
            raw["model"] = yaml.safe_load(cls.model_recipe(name, base).read_text()) or {}
        return raw

    def resolve_paths(self, base: Path) -> None:
        if isinstance(self.model, str):
            from bloomline.config import load_config

            self.model = load_config(ModelConfig, self.model_recipe(self.model, base))
        self.parallel.check_model(self.model)

    def validate(self) -> None:
        if isinstance(self.model, ModelConfig):
            self.parallel.check_model(self.model)
        check(
            not (self.train.precision == "fp32" and self.parallel.zero_stage == 0),
            "parallel.zero_stage",
            "fp32 with zero_stage 0 cannot skip a NaN/inf batch (DeepSpeed's plain optimizer path has no overflow "
            "check); use zero_stage >= 1 or bf16",
        )
        check(
            not (
                self.batch.mixture == "online"
                and self.batch.online.rule == "evaluation"
                and not self.evaluation.enabled
            ),
            "batch.online.rule",
            "evaluation steers by the evaluations made while training runs: it needs evaluation.enabled=true",
        )

    def check_device(self, gpu: bool, torch_version: str = "") -> None:
        """What this recipe needs of the machine it trains on: fp16 and FlexAttention train on GPUs only."""
        if self.train.precision == "fp16" and not self.train.cpu_fp16 and not gpu:
            raise ConfigError(
                "train.precision",
                "fp16 needs GPUs: DeepSpeed's CPU accelerator has no fp16 support on "
                "this CPU; use bf16 (BLOOM's choice) or fp32 here, or "
                "-o train.cpu_fp16=true to run fp16 slowly with torch's reference kernels",
            )
        if isinstance(self.model, ModelConfig) and self.model.attention == "flex" and not gpu:
            raise ConfigError(
                "model.attention",
                f"flex cannot train on CPU: FlexAttention has no CPU backward in torch "
                f"{torch_version}; use sdpa here (flex serves evaluation on CPU)",
            )


MODEL_DIR = Path(__file__).resolve().parents[1] / "configs" / "model"
