"""The training loop of one rank (launched by the DeepSpeed launcher, see training/loop/main.py).

Per step: the dynamic-batch sampler plans the whole step (every rank plans the same step from
the same seed and state and takes its data-parallel slice), the LR is set from warm-up + cosine
× the step's batch-size factor, the micro-batches run through DeepSpeed (``train_batch`` of the
PipelineEngine with PP, forward/backward/step of the engine without), and rank 0 appends one
JSON line to ``RUN_DIR/metrics.jsonl`` and the same scalars to TensorBoard (training/loop/metrics_log.py).
The model is ``training.model.bloom.Bloom``, parallelised by ``training.parallel.parallelize.parallelize`` with
what training/loop/ds_config.py tells DeepSpeed; the run folder and checkpoints are contract 2
(``training/checkpoint/``, ``training/CHECKPOINT.md``), resumed as training/checkpoint/resume.py decides.
"""

from __future__ import annotations

import contextlib
import time
from pathlib import Path
from typing import Any, Iterator

import torch

from bloomline.errors import BloomlineError
from data_prep.storage.data_cache import prepared
from data_prep.storage.shards import check_model_fits, manifest_sha256
from training.checkpoint.integrity import checkpoint_files, file_records
from training.checkpoint.meta import PRECISIONS, make_meta, read_meta, saved_recipe
from training.checkpoint.resume import load_engine, plan_resume, restore_rng, rng_state
from training.checkpoint.run_dir import RunDir, step_dir_name
from training.config import ModelConfig, TrainRecipe, drills
from training.data.mixture.blend import check_resume, run_blend
from training.data.mixture.fixed import FixedMixture
from training.data.mixture.online import OnlineMixture
from training.data.sampler import DynamicBatchSampler
from training.data.shard_reader import ShardIndex, collate, torch_collectives, verify_once
from training.hf.from_hf import start_from
from training.loop.ds_config import adamw, allow_cpu_fp16, deepspeed_config, param_groups
from training.loop.guard import SkipGuard
from training.loop.kernel_choice import resolve_attention
from training.loop.loss import StepLoss, lang_means
from training.loop.metrics_log import MetricsLog, finite
from training.loop.schedule import lr_at, schedule_change
from training.loop.step_row import StepRow
from training.loop.stop import stop_voted
from training.model.bloom import IGNORE_INDEX, Bloom
from training.model.reduced_on_cpu import Fp32Products, needs_fp32_products
from training.parallel.distributed import Mesh, init_distributed
from training.parallel.parallelize import parallelize
from training.planning.flops import ForwardTimer, model_pair_weight, model_params, step_flops


class Trainer:
    def __init__(self, recipe: TrainRecipe, data_dir: str | Path, run_dir: str | Path):
        self.recipe = recipe
        self.data_where = str(data_dir)  # what the checkpoints record: a URL stays one
        self.data_dir = prepared(data_dir)
        self.run = RunDir(Path(run_dir))
        self.run.root.mkdir(parents=True, exist_ok=True)
        cfg = recipe.model
        assert isinstance(cfg, ModelConfig)
        self.mesh: Mesh = init_distributed(recipe.parallel, recipe.train.seed)
        self.dtype = PRECISIONS[recipe.train.precision]
        self.nan_at = drills.nan_at()  # the fault drill's steps, none in real runs
        self.num_params = model_params(cfg)
        self.device = torch.device("cuda") if torch.cuda.is_available() else torch.device("cpu")
        self._setup_data(cfg)
        if recipe.train.precision == "fp16" and self.device.type == "cpu" and drills.cpu_fp16():
            allow_cpu_fp16()
        self._setup_languages()
        self._setup_mixture()
        self._resume_step, universal = plan_resume(self.run, self.data_dir, recipe.parallel)
        self.imported = self._resume_step is None and recipe.train.init_from is not None  # weights, not the seed's
        # train.init_from's weights, and (rank 0) where they came from; a resume reads that back
        init, self.init_from = (
            start_from(recipe, self.index.manifest, self.data_dir, self.mesh.rank) if self.imported else (None, None)
        )
        self._setup_engine(cfg, universal, init)
        self._flops = 0.0  # FLOPs this rank's replica computed in the current step (training/planning/flops.py)
        self.step = 0
        self.saved_step = -1
        self.guard = SkipGuard(recipe.train, self.mesh.rank, self.device)
        self.log = MetricsLog(self.run.metrics, self.run.tensorboard, recipe) if self.mesh.rank == 0 else None
        self._resume()
        if self._resume_step is None:
            self.mixture.cut_log(-1)  # a fresh run: what a failed first attempt logged goes
            self._changes = [self.mixture.start(0)]

    # ----------------------------------------------------------------------------- set-up
    def _setup_data(self, cfg: ModelConfig) -> None:
        """The training split, checked against the model and verified once per run folder, its
        blend and the dynamic-batch sampler that draws from it."""
        recipe = self.recipe
        self.index = ShardIndex(self.data_dir, "train")
        check_model_fits(self.index.manifest, self.data_dir, cfg.vocab_size, cfg.seq_len)
        verify_once(self.index, self.run.data_stamp, self.mesh.rank, self.mesh.world, *torch_collectives())
        self.manifest_sha = manifest_sha256(self.data_dir)
        self.blend = run_blend(recipe, self.index)
        self.sampler = DynamicBatchSampler(
            self.index,
            recipe.batch,
            recipe.parallel.dp,
            cfg.seq_len,
            recipe.train.seed,
            blend=self.blend.weights_for(1),
            pair_weight=model_pair_weight(cfg),
        )

    def _setup_languages(self) -> None:
        """Every sample's language, as an index into the blend's sorted languages, and the loss
        that sums them (per-language loss)."""
        self.languages = sorted(self.sampler.weights)
        at = {lang: i for i, lang in enumerate(self.languages)}
        self._shard_lang = [
            at.get(s["lang"], 0) for s in self.index.shards
        ]  # (0 for an unblended language: never drawn)
        self.loss = StepLoss(len(self.languages))

    def _setup_mixture(self) -> None:
        """The mixture rule the recipe names (``batch.mixture``), steering the sampler's weights."""
        recipe = self.recipe
        self.mixture = (
            OnlineMixture(recipe.batch.online, self.run, self.sampler, self.mesh.rank)
            if recipe.batch.mixture == "online"
            else FixedMixture(self.blend, self.run, self.sampler, self.mesh.rank)
        )
        self._changes: list[Any] = []  # the mixture's decisions to report with the next step's metrics

    def _setup_engine(self, cfg: ModelConfig, universal: bool, init: Any = None) -> None:
        """The model built on the meta device, parallelised into a DeepSpeed engine with its
        optimizer (``universal``: the resumed checkpoint is loaded in universal form; ``init``: the
        weights to start from, else the seed's), the attention kernel, and the forward timer."""
        recipe, o = self.recipe, self.recipe.optim
        with torch.device("meta"):
            model = Bloom(cfg)  # the whole model, holding no memory: each rank materialises its part
        self.engine = parallelize(
            model,
            recipe.parallel,
            seed=recipe.train.seed,
            dtype=self.dtype,
            activation_checkpointing=recipe.train.activation_checkpointing,
            loss_fn=self.loss,
            ds_config=deepspeed_config(recipe, universal),
            device=self.device,
            compile=recipe.train.compile,
            init=init,
            make_optimizer=lambda m: adamw(param_groups(m, o.weight_decay), o, recipe.parallel),
        )
        self.optimizer = self.engine.optimizer
        self.kernel = resolve_attention(
            recipe, self.index, self.sampler, self.dtype, self.device, self.mesh, self.engine.module
        )
        self.forward_timer = ForwardTimer(self.engine.module)
        # bf16/fp16 products in fp32 on a CPU without instructions for them (reduced_on_cpu.py);
        # torch.compile generates its own kernels
        fp32_products = not recipe.train.compile and needs_fp32_products(self.dtype, self.device)
        self.products = (lambda: Fp32Products(self.dtype)) if fp32_products else contextlib.nullcontext
        if fp32_products and self.mesh.rank == 0:
            print(
                f"train.precision={recipe.train.precision}: matrix products in fp32, rounded to "
                f"{recipe.train.precision} (this CPU has no {recipe.train.precision} instructions)",
                flush=True,
            )

    # ----------------------------------------------------------------------------- the loop
    def train(self) -> None:
        """Train to ``train.steps``, saving every ``checkpoint.interval`` steps and at the end; on
        the kill switch (training/loop/stop.py), save the current step and return."""
        if self.imported and self.saved_step != 0:
            self.save()  # step 0: the imported model before any update, evaluated as the run's baseline
        while self.step < self.recipe.train.steps:
            if stop_voted(self.run.stop, self.device):
                if self.saved_step != self.step:
                    self.save()
                if self.mesh.rank == 0:
                    print(f"kill switch {self.run.stop}: saved step {self.step}, exiting", flush=True)
                return
            self._train_step()

    def _train_step(self) -> None:
        """One optimizer step: plan, LR, forward/backward/step, the skip rules (training/loop/guard.py),
        the mixture's next weights, the metrics line, and the checkpoint when one is due."""
        r = self.recipe
        t0 = time.perf_counter()
        plan = self.sampler.next_step()
        self.step += 1
        lr = lr_at(self.step, r) * plan.lr_scale
        for g in self.optimizer.param_groups:
            g["lr"] = lr
        batches = self._prepare(plan)
        skipped_before = self.engine.skipped_steps
        with self.products():
            loss = self._run_checked(batches, plan.gas)
        grad_norm = self.engine.get_global_grad_norm()
        skip = self.guard.verdict(self.engine.skipped_steps > skipped_before, self.loss)
        self.guard.record(self.step, loss, skip)
        work = self._step_totals()  # a collective of the step: inside its time
        self._changes += self.mixture.after_step(  # weights for the next step, decided by every rank alike
            self.step, work["lang_loss"], work["lang_tokens"], work["feedback"], measured=skip != "bad_loss"
        )
        self._log(plan, loss, lr, grad_norm, time.perf_counter() - t0, skip, work)
        if (self.step % r.checkpoint.interval == 0 or self.step == r.train.steps) and self.saved_step != self.step:
            self.save()

    def _prepare(self, plan: Any) -> list[dict[str, torch.Tensor]]:
        """This rank's micro-batches of ``plan``, collated; sets the loss up for the step (its
        labelled tokens over all ranks, the spike limit, the fault drill, the samples' languages).
        A collective: every rank calls it once per step."""
        mine = plan.ranks[self.mesh.dp_rank]
        batches = [collate(self.index, mb, plan.bucket, self.index.pad_id) for mb in mine]
        labelled = torch.tensor(
            [sum(int((b["labels"] != IGNORE_INDEX).sum()) for b in batches)], dtype=torch.long, device=self.device
        )
        torch.distributed.all_reduce(labelled)  # over all ranks = dp · tp · pp copies of each replica
        step_tokens = int(labelled.item()) // (self.mesh.tp * self.mesh.pp)
        self.loss.set_step(
            plan.gas,
            self.mesh.dp,
            step_tokens,
            self.guard.spike_limit(),
            poison=self.step in self.nan_at,
            langs=[torch.tensor([self._shard_lang[sid] for sid, _ in mb]) for mb in mine],
        )
        return batches

    def _run_checked(self, batches: list[dict[str, torch.Tensor]], gas: int) -> float:
        """:meth:`_run`, with DeepSpeed's fp16 scaler giving up turned into a user error."""
        try:
            return self._run(batches, gas)
        except Exception as e:
            if "loss scale already at minimum" in str(e):  # DeepSpeed's fp16 scaler gives up
                raise BloomlineError(
                    f"step {self.step}: fp16 gradients overflow even at the minimum loss scale "
                    f"{self.recipe.train.fp16_min_loss_scale}; a restart would hit it again: use bf16 or "
                    f"lower the learning rate"
                ) from e
            raise

    def _feed(self, b: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        """Micro-batch ``b`` on this rank's device, its FLOPs added to the step's count. Counted on
        the very tensor the model gets, so flex's block mask is built once and shared."""
        b = {k: v.to(self.device) for k, v in b.items()}
        m = self.recipe.model
        self._flops += sum(step_flops([b], self.kernel, m.num_layers, m.hidden_size, self.num_params))
        return b

    def _step_totals(self) -> dict[str, Any]:
        """One row per rank, all-gathered (the step's one small collective of its own): the step's
        FLOPs (all replicas), the DP balance of computed FLOPs and of measured forward time, each
        language's Σ token loss and labelled tokens (from the last pipeline stage), and, with an
        online mixture, rank 0's evaluation feedback (training/data/mixture/online.py)."""
        feedback = self.mixture.row(self.step)
        layout = StepRow(langs=len(self.languages), feedback=len(feedback))
        me = torch.tensor(
            layout.pack(
                dp_rank=self.mesh.dp_rank,
                tp_rank=self.mesh.tp_rank,
                pp_rank=self.mesh.pp_rank,
                flops=self._flops,
                forward_s=self.forward_timer.take(),
                weights=self.mixture.fingerprint(),
                lang_loss=self.loss.lang_loss.tolist(),
                lang_tokens=self.loss.lang_tokens.tolist(),
                feedback=feedback,
            ),
            dtype=torch.float64,
            device=self.device,
        )
        self._flops = 0.0
        rows = [torch.zeros_like(me) for _ in range(self.mesh.world)]
        torch.distributed.all_gather(rows, me)
        return layout.totals(torch.stack(rows).cpu().numpy(), self.mesh.pp, self.step)

    def _run(self, batches: list[dict[str, torch.Tensor]], gas: int) -> float:
        dp = self.mesh.dp
        if self.recipe.parallel.pp > 1:
            self.engine.set_train_batch_size(gas * dp)

            def it() -> Iterator:
                for b in batches:
                    b = self._feed(b)
                    yield (b["input_ids"], b["segment_ids"]), b["labels"]

            return float(self.engine.train_batch(data_iter=it()))
        self.engine.set_train_batch_size(gas * dp)
        total = 0.0
        for i, b in enumerate(batches):
            # gas changes from step to step (bucket, ramp-up): tell DeepSpeed where this step ends,
            # or its running micro-step counter would put the optimizer step mid-batch.
            self.engine.set_gradient_accumulation_boundary(i == gas - 1)
            b = self._feed(b)
            logits = self.engine(b["input_ids"], b["segment_ids"])  # DeepSpeed holds the weights in bf16/fp16
            loss = self.loss(logits, b["labels"])
            self.engine.backward(loss)
            self.engine.step()
            total += float(loss.detach())
        # the reported loss: token mean of the step over all DP ranks
        t = torch.tensor([total / gas], dtype=torch.float64, device=self.device)
        torch.distributed.all_reduce(t)
        return float(t.item()) / self.mesh.world

    # ---------------------------------------------------------------------------- metrics
    def _log(
        self, plan: Any, loss: float, lr: float, grad_norm: Any, dt: float, skip: str | None, work: dict[str, Any]
    ) -> None:
        if self.log is None:  # rank 0 reports
            return
        self.log.record(
            {
                "step": self.step,
                "loss": finite(loss),
                "lr": lr,
                "global_batch_tokens": int(plan.tokens),
                "padded_tokens": int(plan.padded_tokens),
                "padding_fraction": float(plan.padding_fraction),
                "dp_balance": work["dp_balance"],
                "dp_time_balance": work["dp_time_balance"],
                "dp_cost_balance": float(plan.cost_balance),
                "flops": work["flops"],
                "attention": self.kernel,
                "tokens_per_s": plan.tokens / dt if dt > 0 else None,
                "grad_norm": finite(grad_norm),
                "bucket": int(plan.bucket),
                "micro_batches": int(plan.gas),
                "micro_batch_size": int(plan.micro_batch_size),
                "skipped": skip is not None,
                "skip_reason": skip,
                "skipped_batches": self.guard.skipped,
                "fp16_overflows": self.guard.overflows,
                "loss_scale": self._loss_scale(),
                "step_seconds": dt,
                "optimizer_steps": int(self.engine.global_steps),
                "time": time.time(),
                "lang_loss": lang_means(self.languages, work["lang_loss"], work["lang_tokens"]),
                "lang_tokens": dict(plan.lang_tokens),
                "lang_epochs": {k: round(v, 6) for k, v in self.sampler.epochs().items()},
                **self._mixture_fields(),
            }
        )

    def _mixture_fields(self) -> dict[str, Any]:
        """The mixture's weights and cause when the weights changed after this step (the start's are in mixture.jsonl)."""
        moved, self._changes = [c for c in self._changes if c.weights is not None], []
        return {"mixture_weights": moved[-1].weights, "mixture_cause": moved[-1].cause} if moved else {}

    def _loss_scale(self) -> float | None:
        """The fp16 loss scale the next step will use (None unless fp16)."""
        if self.recipe.train.precision != "fp16":
            return None
        opt = self.engine.optimizer
        cfg = getattr(opt, "loss_scale_config", None)  # DeepSpeed's FP16_Optimizer (ZeRO 0)
        return float(cfg.cur_scale if cfg is not None else opt.cur_scale)  # ZeRO optimizers

    # ------------------------------------------------------------------------- checkpoints
    def save(self) -> None:
        """Every rank writes its DeepSpeed files (with its RNG states, training/checkpoint/resume.py); then
        rank 0 publishes bloomline.json and ``latest``."""
        self.engine.save_checkpoint(
            str(self.run.checkpoints),
            tag=step_dir_name(self.step),
            client_state={"rng": rng_state()},
            save_latest=False,
        )
        torch.distributed.barrier()
        # each rank hashes a share of the files (training/checkpoint/integrity.py), rank 0 records them all
        step_dir = self.run.step_dir(self.step)
        names = [checkpoint_files(step_dir) if self.mesh.rank == 0 else None]  # one listing (NFS caches differ)
        torch.distributed.broadcast_object_list(names, src=0)
        names = names[0]
        shares: list[Any] = [None] * self.mesh.world
        torch.distributed.all_gather_object(shares, file_records(step_dir, names[self.mesh.rank :: self.mesh.world]))
        if self.mesh.rank == 0:
            meta = make_meta(
                self.step,
                self.recipe,
                self.data_where,
                self.manifest_sha,
                self.sampler.state_dict(),
                self.guard.state_dict(),
                self.mixture.state_dict(),
                self.blend.identity(),
                files={k: v for share in shares for k, v in share.items()},
                init_from=self.init_from,
            )
            # `latest` moves once all ranks wrote; what the evaluation watcher holds is kept (RunDir.hold)
            self.run.publish(self.step, meta, self.recipe.checkpoint.keep)
        torch.distributed.barrier()
        self.saved_step = self.step

    def _resume(self) -> None:
        if self._resume_step is None:
            return
        step_dir = self.run.step_dir(self._resume_step)
        meta = read_meta(step_dir)
        client = load_engine(self.engine, self.run, self._resume_step, meta)
        # DeepSpeed restores the checkpoint's clipping threshold with the optimizer; the recipe rules.
        if hasattr(self.engine.optimizer, "clip_grad"):
            self.engine.optimizer.clip_grad = self.recipe.optim.clip_grad
        restore_rng((client or {}).get("rng"))
        self.step = meta["step"]
        self.saved_step = self.step
        self.init_from = meta.get("init_from")
        self.guard.load_state_dict(meta["trainer"])
        self.sampler.load_state_dict(meta["sampler"])
        check_resume(meta["blend"], self.blend, self.step)
        self.mixture.resume(meta["mixture"], self.step)
        torch.distributed.barrier()  # every rank has read the decisions log before rank 0 cuts it
        self.mixture.cut_log(self.step)
        if self.log is not None:
            self.log.truncate(self.step)  # steps after the checkpoint were lost with the failed job
            how = " (universal form, another layout)" if self.engine.load_universal_checkpoint() else ""
            print(f"resumed from {step_dir}{how} at step {self.step}", flush=True)
            change = schedule_change(saved_recipe(meta), self.recipe, self.step)
            if change:
                print(change, flush=True)
