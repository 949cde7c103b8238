"""Evaluate a checkpoint per language (``bloomline evaluate``): the validation task (loss,
perplexity, bits per byte of the data's validation split) and every task of ``tasks``
(eval/tasks/), plus a few greedy generations.

The model is the checkpoint's whole single-device ``Bloom`` (``training.checkpoint.load.load_model``,
any layout) in this process, on the CPU or the accelerator (``device``), or the checkpoint spread
over ``parallel``'s tp·pp ranks, whose rank 0 runs :func:`evaluate_with` here (eval/parallel/);
the tasks see either through one interface (eval/model.py). Which of the two runs is chosen
above both, in eval/publish.py ``evaluate``: nothing here starts ranks. Results are rows of contract 3 (``eval/results/table.py``,
``eval/RESULTS.md``): one per (task, scope, language, weighting, metric), with the checkpoint's
identity and the training tokens of the language it had seen.
"""

from __future__ import annotations

import datetime as dt
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Optional

import torch

from bloomline.errors import CheckpointError, ConfigError
from bloomline.task_spec import TaskSpec
from bloomline.tokenizer import open_tokenizer
from data_prep.storage.shards import load_manifest, manifest_path, tokenizer_file
from eval.generate import generate
from eval.model import EvalModel, resolve_device
from eval.published import PUBLISHED, SETTING, architecture, evaluated_meta, is_published, other_model
from eval.results.metrics import GROUPS, group_of
from eval.tasks import make, validation_spec
from eval.tasks.base import Context, Task
from eval.tasks.validation import language_samples
from training.checkpoint.meta import model_config
from training.checkpoint.run_dir import META_FILE
from training.config import EvalConfig, ParallelConfig
from training.data.shard_reader import ShardIndex, verify_once
from training.parallel.layout import layout_label


@dataclass
class Evaluation:
    rows: list[dict[str, Any]]
    """Result rows (contract 3) with the checkpoint's identity added."""
    generations: list[dict[str, Any]]
    seconds: float
    tokens: int
    """Validation tokens evaluated."""
    task_seconds: dict[str, float]
    """Seconds each task took."""

    def validation(self) -> list[dict[str, Any]]:
        """The validation task's rows in wide form (eval/results/rows.py validation_rows)."""
        import pyarrow as pa

        from eval.results.rows import validation_rows
        from eval.results.table import SCHEMA

        return validation_rows(pa.Table.from_pylist(self.rows, schema=SCHEMA))


def generations(
    model: EvalModel, index: ShardIndex, cfg: EvalConfig, decode: Callable[[list[int]], str], eos_id: int
) -> list[dict[str, Any]]:
    """``cfg.prompts_per_lang`` greedy generations per language, from the first ``cfg.prompt_tokens``
    tokens of its first validation documents (fixed, so rounds compare), decoded together."""
    prompts: list[tuple[str, int, list[int]]] = []
    for lang in index.languages:
        mine: list[list[int]] = []
        for _, refs in language_samples(index, lang, None):
            for sid, row in refs:
                toks, offsets = index.fetch(sid, row)
                for start in offsets.tolist():
                    doc = toks[start : start + cfg.prompt_tokens].tolist()
                    if len(doc) == cfg.prompt_tokens and eos_id not in doc and len(mine) < cfg.prompts_per_lang:
                        mine.append(doc)
            if len(mine) >= cfg.prompts_per_lang:
                break
        prompts += [(lang, k, p) for k, p in enumerate(mine)]
    outs = generate(model, [p for _, _, p in prompts], cfg.new_tokens, eos_id)
    return [
        {"lang": lang, "k": k, "prompt": decode(p), "completion": decode(o)} for (lang, k, p), o in zip(prompts, outs)
    ]


def seen(scope: str, lang: str, tokens_seen: dict[str, int], langs: list[str]) -> int:
    """Training tokens the checkpoint had consumed of a row's language, or summed over its group or all."""
    if scope == "language":
        return int(tokens_seen.get(lang, 0))
    members = [l for l in langs if scope == "overall" or (lang in GROUPS and group_of(l) == lang)]
    return int(sum(tokens_seen.get(l, 0) for l in members))


def heldout_data(data_dir: Path, cfg: EvalConfig) -> Path:
    """The data whose validation split is evaluated: the training data's, or ``cfg.heldout`` when
    its tokenizer is the training data's (the same pieces: the same sha256)."""
    if not cfg.heldout:
        return data_dir
    other = Path(cfg.heldout)
    mine, theirs = (load_manifest(d)["tokenizer"] for d in (data_dir, other))
    if mine.get("sha256") != theirs.get("sha256"):
        raise ConfigError(
            "heldout",
            f"{manifest_path(other)} was tokenized with another tokenizer than {manifest_path(data_dir)}; "
            f"prepare it with -o tokenizer.model={data_dir / mine['path']}",
        )
    return other


def precision_of(cfg: EvalConfig, device: torch.device) -> str:
    """The evaluation's precision: ``cfg.precision``, else bf16 on a GPU and fp32 on the CPU."""
    return cfg.precision or ("bf16" if device.type == "cuda" else "fp32")


def checked(ckpt_dir: Path, data_dir: Path, cfg: EvalConfig) -> dict[str, Any]:
    """The checkpoint's bloomline.json (or a published folder's equivalent: eval/published.py), once
    the settings, the tasks, the device and the layout are known to fit it and the data is the data
    it trained on (a published model's: text cut by its own tokenizer)."""
    check_settings(cfg)
    meta = evaluated_meta(ckpt_dir, data_dir)
    if other_model(meta) is None:
        check_eval_layout(cfg, model_config(meta))
    else:
        one_process(cfg, meta["arch"])
    return meta


def check_settings(cfg: EvalConfig) -> None:
    """What the settings alone can get wrong: an unknown task or one without its data, a device
    this machine lacks (ranks on other hosts check their own)."""
    for spec in [validation_spec(), *cfg.tasks]:
        make(spec)
    if cfg.parallel.hostfile is None:
        resolve_device(cfg.device)


def one_process(cfg: EvalConfig, arch: str) -> None:
    """A causal LM of another architecture than BLOOM runs as transformers' class, in this process."""
    if cfg.parallel.world_size > 1:
        raise ConfigError(
            "parallel",
            f"a '{arch}' model is evaluated in one process (tp·pp layouts are for BLOOM, which bloomline builds): "
            f"set parallel.tp=1 and parallel.pp=1",
        )


def check_published(folder: Path, cfg: EvalConfig) -> None:
    """Before ``--text`` is prepared: the folder is a Hugging Face BLOOM with its tokenizer, and the
    tasks, the device and the layout fit it (eval/published.py)."""
    from training.config import ModelConfig
    from training.hf.from_hf import open_source

    if not is_published(folder):
        raise CheckpointError(
            f"{SETTING}: {folder} is not a Hugging Face model folder (config.json)"
            + (": a bloomline checkpoint goes with --checkpoint" if (folder / META_FILE).is_file() else "")
        )
    if not (folder / "tokenizer.json").is_file():
        raise CheckpointError(f"{SETTING}: {folder} has no tokenizer.json; a model is evaluated on text cut by its own")
    check_settings(cfg)
    arch = architecture(folder)
    if arch != "bloom":
        return one_process(cfg, arch)
    src = open_source(folder, SETTING)
    check_eval_layout(cfg, ModelConfig(vocab_size=src.rows, **src.shape))


def check_eval_layout(cfg: EvalConfig, model: Any, prefix: str = "") -> None:
    """The evaluation layout must cut the model as training's would: tp divides its heads (and
    hidden size and padded vocabulary), pp is at most its layers. ``prefix``: where the settings
    sit in the recipe the user wrote (``evaluation.settings.`` in a training recipe)."""
    try:
        ParallelConfig(tp=cfg.parallel.tp, pp=cfg.parallel.pp).check_model(model)
    except ConfigError as e:
        raise ConfigError(prefix + e.key, e.message) from None


def evaluate_with(
    model: EvalModel,
    meta: dict[str, Any],
    ckpt_dir: Path,
    data_dir: Path,
    cfg: EvalConfig,
    run: str,
    stamp: Optional[Path] = None,
    progress: Callable[[str], None] = lambda msg: None,
) -> Evaluation:
    """Every task, then the generations, on ``model`` (whatever runs it); rows with the
    checkpoint's identity and the layout they were evaluated in."""
    t0 = time.perf_counter()
    tasks = [(spec, make(spec)) for spec in [validation_spec(), *cfg.tasks]]
    index = ShardIndex(heldout_data(data_dir, cfg), "valid")
    if stamp is not None:
        verify_once(index, stamp)
    tok = index.manifest["tokenizer"]
    model_file = tokenizer_file(data_dir, index.manifest)
    eos = int(tok["eos_id"])
    tokenizer = open_tokenizer(model_file, tok["sha256"])
    tokens_seen = meta["sampler"]["tokens_by_lang"]
    base = dict(
        model=model,
        tokenizer=tokenizer,
        index=index,
        token_bytes=tokenizer.token_bytes(),
        tokenizer_file=model_file,
        eos_id=eos,
        settings=cfg,
        tokens_seen=tokens_seen,
        progress=progress,
    )
    rows, seconds, tokens = _run_tasks(tasks, base)
    gens = generations(model, index, cfg, tokenizer.decode, eos) if cfg.prompts_per_lang and cfg.new_tokens else []
    ident = _identity(model, meta, ckpt_dir, cfg, run)
    train = _train_tokens(data_dir)

    def companions(r: dict[str, Any]) -> dict[str, Any]:
        n, of = (seen(r["scope"], r["lang"], t, index.languages) for t in (tokens_seen, train))
        return {"tokens_seen": n, "epochs_seen": n / of if of else None}

    rows = [{**ident, **r, **companions(r)} for r in rows]
    gens = [{**{k: ident[k] for k in ("run", "step", "precision", "evaluated_at")}, **g} for g in gens]
    return Evaluation(rows, gens, time.perf_counter() - t0, tokens, seconds)


def _run_tasks(
    tasks: list[tuple[TaskSpec, Task]], base: dict[str, Any]
) -> tuple[list[dict[str, Any]], dict[str, float], int]:
    """Each task in turn, in a Context of its spec and ``base``: their rows (without the
    checkpoint's identity), the seconds each task took, and the validation tokens evaluated."""
    rows, seconds, tokens = [], {}, 0
    for spec, task in tasks:
        t = time.perf_counter()
        rows += [r.to_dict(task.name) for r in task.run(Context(spec=spec, **base))]
        seconds[task.name] = seconds.get(task.name, 0.0) + time.perf_counter() - t
        tokens += getattr(task, "tokens", 0)
    return rows, seconds, tokens


def _identity(model: EvalModel, meta: dict[str, Any], ckpt_dir: Path, cfg: EvalConfig, run: str) -> dict[str, Any]:
    """The columns every row of this evaluation shares: the run, the checkpoint, the precision and
    both layouts, the data, and now as ``evaluated_at`` (called when the evaluation has ended)."""
    return {
        "run": run,
        "step": int(meta["step"]),
        "checkpoint": str(ckpt_dir.resolve()),
        "precision": precision_of(cfg, model.device),
        "layout": PUBLISHED if meta.get("kind") == PUBLISHED else layout_label(meta["layout"]),
        "eval_layout": model.layout,
        "data_manifest_sha256": meta["data_manifest_sha256"],
        "evaluated_at": dt.datetime.now(dt.timezone.utc),
    }


def _train_tokens(data_dir: Path) -> dict[str, int]:
    """Each language's training tokens in the data (its manifest): epochs seen = tokens seen ÷ these."""
    train: dict[str, int] = {}
    for sh in load_manifest(data_dir)["shards"]:
        if sh["split"] == "train":
            train[sh["lang"]] = train.get(sh["lang"], 0) + int(sh["tokens"])
    return train
