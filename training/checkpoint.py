"""Contract 2: the run folder and its checkpoints (``training/CHECKPOINT.md``).

Everything that reads or writes checkpoint files goes through this module: the folder layout
(:class:`RunDir`: ``checkpoints/step_N/``, ``latest``, keep-last-K), the versioned
``bloomline.json`` (:func:`make_meta`, :func:`read_meta`, checked at load time with messages that
name the file and the field), layout detection from the files DeepSpeed wrote
(:func:`detect_layout`), and the one public loader, :func:`load_model`, which returns the whole
single-device :class:`~training.model.Bloom` from a checkpoint of any TP/PP/DP/ZeRO layout in one
process, with no distributed setup.
"""

from __future__ import annotations

import contextlib
import io
import json
import re
import shutil
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Iterable, Optional

import torch

import bloomline
from bloomline.config import from_dict, to_dict
from bloomline.errors import CheckpointError, ConfigError
from bloomline.io import read_contract_json, sha256_file, write_bytes_atomic, write_json_atomic
from bloomline.secrets import mask_tree
from training.config import ModelConfig, TrainRecipe
from training.layout import (
    LAYOUT_KEYS,
    bloom_name,
    first_mismatch,
    layout_label,
    layout_of,
    pipeline_prefixes,
    tp_merge,
    tp_rules,
)

FORMAT_VERSION = 2  # 2: the online mixture's state (``mixture``); version 1 files read as a fixed mixture
READS_VERSIONS = (1, 2)
META_FILE = "bloomline.json"
PRECISIONS = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}
_TAG = re.compile(r"^step_(\d+)$")


# ------------------------------------------------------------------------------------ the folder


def step_dir_name(step: int) -> str:
    return f"step_{step}"


def step_of_dir_name(tag: str, where: Path | str = "") -> int:
    """N of ``step_N``; CheckpointError naming ``where`` for anything else."""
    m = _TAG.match(tag)
    if not m:
        raise CheckpointError(f"{where}: '{tag}' is not a checkpoint name (step_N)")
    return int(m.group(1))


@dataclass
class RunDir:
    """A training run's folder (``bloomline train --out``)."""

    root: Path

    def __post_init__(self) -> None:
        self.root = Path(self.root)

    @property
    def checkpoints(self) -> Path:
        return self.root / "checkpoints"

    @property
    def latest_file(self) -> Path:
        return self.checkpoints / "latest"

    metrics = property(lambda self: self.root / "metrics.jsonl")
    recipe = property(lambda self: self.root / "recipe.json")
    stop = property(lambda self: self.root / "STOP")  # touch it: save a checkpoint and exit cleanly
    tensorboard = property(lambda self: self.root / "tensorboard")
    logs = property(lambda self: self.root / "logs")
    data_stamp = property(lambda self: self.root / "data_verified.json")  # training/data.py: verify_once
    # what evaluation writes into the run (eval/RESULTS.md) and the dashboard reads
    eval = property(lambda self: self.root / "eval")
    results = property(lambda self: self.eval / "results")
    generations = property(lambda self: self.eval / "generations")
    skipped = property(lambda self: self.eval / "skipped.jsonl")
    eval_stamp = property(lambda self: self.eval / "data_verified.json")  # the validation shards' checksums
    training_done = property(lambda self: self.eval / "training_done")  # the watcher drains, then exits
    # the evaluation key (flows/pipeline.py) the results in eval/ were made with; absent: unknown
    evaluated_with = property(lambda self: self.eval / "evaluated_with.json")
    dashboard = property(lambda self: self.root / "dashboard")
    # the online mixture (training/mixture.py): its changes, write-ahead; the evaluations it may
    # read (written by eval/publish.py, one file per evaluated checkpoint); the reference run's curve
    mixture_log = property(lambda self: self.root / "mixture.jsonl")
    mixture_feedback = property(lambda self: self.root / "mixture" / "feedback")
    mixture_reference = property(lambda self: self.root / "mixture" / "reference.json")

    @classmethod
    def of_checkpoint(cls, step_dir: str | Path) -> "RunDir":
        """The run a checkpoint folder (``RUN_DIR/checkpoints/step_N``) belongs to."""
        return cls(Path(step_dir).resolve().parent.parent)

    def step_dir(self, step: int) -> Path:
        return self.checkpoints / step_dir_name(step)

    def latest_step(self) -> Optional[int]:
        """The step ``latest`` points to (None before the first checkpoint)."""
        if not self.latest_file.is_file():
            return None
        step = step_of_dir_name(self.latest_file.read_text().strip(), self.latest_file)
        if not (self.step_dir(step) / META_FILE).is_file():
            raise CheckpointError(f"{self.latest_file} points to {step_dir_name(step)}, which has no {META_FILE}")
        return step

    def latest_dir(self) -> Optional[Path]:
        step = self.latest_step()
        return None if step is None else self.step_dir(step)

    def complete_steps(self) -> list[int]:
        """Steps whose folder holds a bloomline.json (written last), ascending."""
        if not self.checkpoints.is_dir():
            return []
        return sorted(
            int(m.group(1))
            for p in self.checkpoints.iterdir()
            if (m := _TAG.match(p.name)) and (p / META_FILE).is_file()
        )

    def publish(self, step: int, meta: dict[str, Any], keep: int) -> None:
        """After every rank has written its files: write bloomline.json, move ``latest`` to the
        step (atomically), then :meth:`prune` up to it."""
        write_json_atomic(self.step_dir(step) / META_FILE, meta)
        write_bytes_atomic(self.latest_file, step_dir_name(step).encode())
        self.prune(keep, step)

    # -- the hold: another process (the evaluation watcher) asks prune to keep what it still needs
    hold_file = property(lambda self: self.checkpoints / "hold.json")
    pruned_log = property(lambda self: self.checkpoints / "pruned.jsonl")

    def hold(self, pid: int, released: Iterable[int], max_deferred: int, busy: Optional[int] = None) -> None:
        """While process ``pid`` lives, :meth:`prune` keeps every complete checkpoint not in
        ``released``, up to ``max_deferred`` of them, and the one it is ``busy`` with in any case
        (``checkpoints/hold.json``, CHECKPOINT.md)."""
        write_json_atomic(
            self.hold_file,
            {"pid": pid, "released": sorted(set(released)), "max_deferred": max_deferred, "busy": busy},
            durable=False,
        )

    def holder(self) -> Optional[dict[str, Any]]:
        """The hold, when its process is alive (a hold left by a dead process holds nothing)."""
        import os

        try:
            h = read_contract_json(self.hold_file, CheckpointError, "")
            os.kill(int(h["pid"]), 0)
            return h
        except (CheckpointError, OSError, ValueError, KeyError, TypeError):
            return None

    def pruned(self) -> list[dict[str, Any]]:
        """``{"step", "reason"}`` of every held checkpoint :meth:`prune` deleted, in order."""
        if not self.pruned_log.is_file():
            return []
        return [json.loads(line) for line in self.pruned_log.read_text().splitlines() if line.strip()]

    def prune(self, keep: int, upto: Optional[int] = None, writer: bool = True) -> list[int]:
        """Delete the checkpoints older than the newest ``keep`` up to step ``upto`` (default:
        ``latest``), and — for the run's ``writer`` only, the trainer or the flow once its ranks
        have ended — every other folder that is not one of them: incomplete ones (a killed save)
        and any above ``upto`` (written by a job that died before moving ``latest``; a run resumed
        from an earlier step has replaced that future). Another process (the evaluation watcher)
        passes ``writer=False``: to it, a folder above ``latest`` may be a save in progress, and
        deleting one took the files from under the ranks writing it. While a :meth:`hold` is
        alive, the complete checkpoints it has not released are kept too, up to its
        ``max_deferred``; older held ones are deleted, each with its reason appended to
        ``checkpoints/pruned.jsonl``. Returns the steps deleted."""
        upto = self.latest_step() if upto is None else upto
        if upto is None:
            return []
        complete = [s for s in self.complete_steps() if s <= upto]
        kept = set(complete[-keep:]) | {upto}
        hold = self.holder()
        released, max_deferred = (set(hold["released"]), hold["max_deferred"]) if hold else (set(), 0)
        deferred = [s for s in complete[:-keep] if hold and s not in released]
        late = deferred[: len(deferred) - max_deferred] if len(deferred) > max_deferred else []
        if hold and hold.get("busy") is not None:  # being read now: never pulled from under its reader
            kept.add(hold["busy"])
            late = [s for s in late if s != hold["busy"]]
        if late:
            with open(
                self.pruned_log, "a", encoding="utf-8"
            ) as log:  # one short line per write: appends do not interleave
                for s in late:
                    log.write(
                        json.dumps(
                            {
                                "step": s,
                                "reason": f"deleted by checkpoint.keep={keep} before its evaluation "
                                f"ran: more than evaluation.max_deferred={max_deferred} checkpoints were "
                                f"waiting for one",
                            }
                        )
                        + "\n"
                    )
        kept |= set(deferred) - set(late)
        return self._delete(lambda step: step not in kept and (writer or step in complete))

    def discard_unpublished(self) -> list[int]:
        """Delete the step folders ``latest`` does not stand for: incomplete ones (a killed save)
        and any above it (saved by a job killed before it moved ``latest``: the run resumed from
        ``latest`` replaces that future, and nothing may read it meanwhile). For the run's writer
        before its ranks start; the steps deleted."""
        upto = self.latest_step() or 0
        complete = set(self.complete_steps())
        return self._delete(lambda step: step > upto or step not in complete)

    def _delete(self, condemned: Callable[[int], bool]) -> list[int]:
        deleted = []
        for p in self.checkpoints.iterdir() if self.checkpoints.is_dir() else []:
            m = _TAG.match(p.name)
            if m and condemned(int(m.group(1))):
                shutil.rmtree(p, ignore_errors=True)
                deleted.append(int(m.group(1)))
        return sorted(deleted)


# ---------------------------------------------------------------------------------- bloomline.json


def trained_on(meta: dict[str, Any], data_dir: str | Path) -> bool:
    """Whether the checkpoint of ``meta`` (its bloomline.json) was trained on the data in ``data_dir``."""
    from data_prep.shards import manifest_sha256

    return meta["data_manifest_sha256"] == manifest_sha256(data_dir)


def make_meta(
    step: int,
    recipe: TrainRecipe,
    data_dir: str | Path,
    data_manifest_sha256: str,
    sampler: dict[str, Any],
    trainer: dict[str, Any],
    mixture: Optional[dict[str, Any]] = None,
) -> dict[str, Any]:
    """The bloomline.json of a checkpoint (fields in training/CHECKPOINT.md)."""
    from training.model import full_shapes

    assert isinstance(recipe.model, ModelConfig)
    return {
        "format_version": FORMAT_VERSION,
        "written_by": f"bloomline {bloomline.__version__}",
        "step": step,
        "layout": layout_of(recipe.parallel),
        "precision": recipe.train.precision,
        "model": to_dict(recipe.model),
        "data_dir": str(Path(data_dir).resolve()),
        "data_manifest_sha256": data_manifest_sha256,
        "sampler": sampler,
        "tp_rules": tp_rules(list(full_shapes(recipe.model))),
        "trainer": trainer,
        "mixture": mixture,
        "recipe": mask_tree(to_dict(recipe)),
    }


TRAINER_KEYS = ("skipped", "fp16_overflows", "skipped_in_a_row", "loss_ema")
SAMPLER_KEYS = ("version", "seed", "step", "consumed_tokens", "tokens_by_lang", "streams")
_FIELDS: dict[str, type | tuple[type, ...]] = {
    "format_version": int,
    "step": int,
    "layout": dict,
    "precision": str,
    "model": dict,
    "data_dir": str,
    "data_manifest_sha256": str,
    "sampler": dict,
    "tp_rules": dict,
    "trainer": dict,
    "recipe": dict,
}


def read_meta(step_dir: str | Path) -> dict[str, Any]:
    """Read and check ``step_dir/bloomline.json``; CheckpointError naming the file and field."""
    step_dir = Path(step_dir)
    path = step_dir / META_FILE
    meta = read_contract_json(
        path, CheckpointError, f"is {step_dir} a complete bloomline checkpoint (RUN_DIR/checkpoints/step_N)?"
    )
    if not isinstance(meta, dict) or "format_version" not in meta:
        raise CheckpointError(f"{path}: no field 'format_version' (written by a bloomline before checkpoint format 1?)")
    if meta["format_version"] not in READS_VERSIONS:
        raise CheckpointError(
            f"{path}: field 'format_version' is {meta['format_version']!r}, this bloomline reads "
            f"{' and '.join(map(str, READS_VERSIONS))}"
        )
    meta.setdefault("mixture", None)  # version 1: a fixed mixture
    if meta["mixture"] is not None and not isinstance(meta["mixture"], dict):
        raise CheckpointError(f"{path}: field 'mixture' should be null or a dict, got {meta['mixture']!r}")
    for key, tp in _FIELDS.items():
        if key not in meta:
            raise CheckpointError(f"{path}: field '{key}' is missing")
        if not isinstance(meta[key], tp) or isinstance(meta[key], bool):
            raise CheckpointError(f"{path}: field '{key}' should be a {tp.__name__}, got {meta[key]!r}")
    want = step_of_dir_name(step_dir.name, step_dir) if _TAG.match(step_dir.name) else meta["step"]
    if meta["step"] != want:
        raise CheckpointError(f"{path}: field 'step' is {meta['step']}, the folder is {step_dir.name}")
    for k in LAYOUT_KEYS:
        v = meta["layout"].get(k)
        if not isinstance(v, int) or v < (0 if k == "zero_stage" else 1):
            raise CheckpointError(f"{path}: field 'layout.{k}' is {v!r}")
    missing = [k for k in TRAINER_KEYS if k not in meta["trainer"]]
    if missing:
        raise CheckpointError(f"{path}: field 'trainer' lacks {missing}")
    missing = [k for k in SAMPLER_KEYS if k not in meta["sampler"]]
    if missing:
        raise CheckpointError(f"{path}: field 'sampler' lacks {missing}")
    if meta["precision"] not in PRECISIONS:
        raise CheckpointError(f"{path}: field 'precision' is {meta['precision']!r}, not one of {sorted(PRECISIONS)}")
    try:
        cfg = from_dict(ModelConfig, meta["model"], "model")
    except ConfigError as e:
        raise CheckpointError(f"{path}: field '{e.key}': {e.message}") from None
    if not re.fullmatch(r"[0-9a-f]{64}", meta["data_manifest_sha256"]):
        raise CheckpointError(f"{path}: field 'data_manifest_sha256' is not a sha256 hex digest")
    from training.model import full_shapes

    names = set(full_shapes(cfg))
    if set(meta["tp_rules"]) != names:
        odd = sorted(set(meta["tp_rules"]) ^ names)[:3]
        raise CheckpointError(f"{path}: field 'tp_rules' does not list exactly the model's parameters (e.g. {odd})")
    bad = {k: v for k, v in meta["tp_rules"].items() if v not in (None, 0, 1)}
    if bad:
        raise CheckpointError(f"{path}: field 'tp_rules' has cut dims other than null, 0, 1: {bad}")
    return meta


def model_config(meta: dict[str, Any]) -> ModelConfig:
    return from_dict(ModelConfig, meta["model"])


def saved_recipe(meta: dict[str, Any]) -> TrainRecipe:
    return from_dict(TrainRecipe, meta["recipe"])


# ---------------------------------------------------------------------------------- the files


def _optim_files(step_dir: Path) -> list[Path]:
    return sorted(step_dir.glob("*zero_pp_rank_*_mp_rank_*_optim_states.pt"))


def weights_digest(step_dir: str | Path) -> str:
    """sha256 over the bytes of the checkpoint's weights (every ``*model_states.pt`` file, by name)
    and its bloomline.json: what an export of it depends on."""
    import hashlib

    step_dir = Path(step_dir)
    h = hashlib.sha256()
    for f in [*sorted(step_dir.glob("*model_states.pt")), step_dir / META_FILE]:
        h.update(f.name.encode() + b"\0" + sha256_file(f).encode())
    return h.hexdigest()


def detect_layout(step_dir: str | Path, num_layers: int) -> dict[str, int]:
    """What the files DeepSpeed wrote say about the layout: ``tp``, ``pp``, ``model_parallel``
    (tp·pp, the number of model-state files) and ``dp`` (the ZeRO optimizer partitions per
    model-parallel rank; 0 when there are none — ZeRO stage 0 writes them only for bf16)."""
    step_dir = Path(step_dir)
    layer_files = list(step_dir.glob("layer_*-model_*-model_states.pt"))
    # one per model-parallel rank: mp_rank_XX_model_states.pt, or with ZeRO-3 one per DP rank too
    # (zero_pp_rank_D_mp_rank_XX_model_states.pt)
    mp_files = list(
        {
            re.search(r"mp_rank_(\d+)_model_states", p.name).group(1)  # type: ignore[union-attr]
            for p in step_dir.glob("*mp_rank_*_model_states.pt")
        }
    )
    optim = _optim_files(step_dir)
    if layer_files:
        tp = len({re.search(r"-model_(\d+)-", p.name).group(1) for p in layer_files})  # type: ignore[union-attr]
        layers = {int(re.match(r"layer_(\d+)-", p.name).group(1)) for p in layer_files}  # type: ignore[union-attr]
        want = set(range(len(pipeline_prefixes(num_layers)) - 1))
        if layers != want:
            raise CheckpointError(f"{step_dir}: pipeline layer files for layers {sorted(want - layers)} are missing")
        pp = len(mp_files) // tp
    else:
        tp, pp = len(mp_files), 1
    mp = {re.search(r"mp_rank_(\d+)", p.name).group(1) for p in optim}  # type: ignore[union-attr]
    dp = len(optim) // max(len(mp), 1) if optim else 0
    return {"tp": tp, "pp": pp, "model_parallel": len(mp_files), "dp": dp}


def check_files(step_dir: Path, meta: dict[str, Any]) -> None:
    """The files present agree with bloomline.json's ``layout``."""
    lay, cfg = meta["layout"], model_config(meta)
    found = detect_layout(step_dir, cfg.num_layers)
    where = step_dir / META_FILE

    def refuse(field: str, what: str) -> None:
        raise CheckpointError(f"{where}: field 'layout.{field}' is {lay[field]}, but {step_dir} {what}")

    if found["tp"] != lay["tp"]:
        refuse("tp", f"holds model files of {found['tp']} TP rank(s)")
    if found["pp"] != lay["pp"]:
        refuse(
            "pp",
            f"holds the files of {found['pp']} pipeline stage(s)"
            if found["pp"] > 1 or lay["pp"] == 1
            else "holds no per-layer pipeline files",
        )
    if lay["zero_stage"] >= 1 and found["dp"] != lay["dp"]:
        refuse("dp", f"holds {found['dp']} ZeRO optimizer partition(s) per model-parallel rank")


def _load(path: Path) -> Any:
    if not path.is_file():
        raise CheckpointError(f"{path} is missing")
    try:
        # DeepSpeed's files hold Python objects (its config, our RNG state): trusted files of our own runs.
        return torch.load(path, map_location="cpu", weights_only=False)
    except Exception as e:  # a truncated or overwritten file: torch's own error says little
        raise CheckpointError(f"{path} is unreadable ({type(e).__name__}: {e})") from None


def _rank_weights(step_dir: Path, meta: dict[str, Any], tp_rank: int) -> tuple[dict[str, torch.Tensor], str]:
    """One TP rank's parameters under Bloom names, and the file(s) they came from."""
    lay, cfg = meta["layout"], model_config(meta)
    if lay["zero_stage"] == 3:
        return _zero3_weights(step_dir, tp_rank, PRECISIONS[meta["precision"]]), f"{step_dir}/*mp_rank_{tp_rank:02d}*"
    out: dict[str, torch.Tensor] = {}
    if lay["pp"] > 1:
        for idx, prefix in enumerate(pipeline_prefixes(cfg.num_layers)[:-1]):
            f = step_dir / f"layer_{idx:02d}-model_{tp_rank:02d}-model_states.pt"
            out.update({f"{prefix}.{k}": v for k, v in _load(f).items()})
        where = f"{step_dir}/layer_*-model_{tp_rank:02d}-model_states.pt"
    else:
        f = step_dir / f"mp_rank_{tp_rank:02d}_model_states.pt"
        module = _load(f).get("module")
        if not isinstance(module, dict):
            raise CheckpointError(f"{f}: no module weights")
        out = {bloom_name(k, cfg.num_layers): v for k, v in module.items()}
        where = str(f)
    # megatron-core layers add an empty '_extra_state' entry; it carries nothing
    return {k: v for k, v in out.items() if not k.endswith("_extra_state")}, where


def _zero3_weights(step_dir: Path, tp_rank: int, dtype: torch.dtype) -> dict[str, torch.Tensor]:
    """ZeRO-3 keeps no whole weights in the model-state files: gather this TP rank's fp32 master
    partitions with DeepSpeed's ``zero_to_fp32`` (which reads one model-parallel rank's files, so
    they are linked into a folder of their own) and round them to the training precision, which
    is what the bf16/fp16 copies the model computed with hold."""
    from deepspeed.utils.zero_to_fp32 import get_fp32_state_dict_from_zero_checkpoint

    with tempfile.TemporaryDirectory() as tmp:
        tag = Path(tmp) / "t"
        tag.mkdir()
        for f in step_dir.glob(f"*mp_rank_{tp_rank:02d}_*.pt"):
            (tag / f.name).symlink_to(f.resolve())
        with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):
            sd = get_fp32_state_dict_from_zero_checkpoint(tmp, tag="t")
    return {k: v.to(dtype) for k, v in sd.items()}


def load_model(ckpt_dir: str | Path, dtype: torch.dtype = torch.float32) -> tuple[Any, dict[str, Any]]:
    """The whole model of a checkpoint of any layout, as a single-device ``Bloom`` in ``dtype``
    (eval mode, on CPU), and the checkpoint's checked bloomline.json.

    TP slices are merged (cuts from the checkpoint's own ``tp_rules``), pipeline stages joined,
    ZeRO-3 partitions gathered. The weights are those the model computed with at that step (the
    training precision's copy of the fp32 master weights), converted to ``dtype``. Before merging,
    every parameter that TP ranks hold whole (LayerNorms, row-parallel biases) must be equal on all
    of them: BLOOM-176B's LayerNorms drifted apart across TP ranks under bf16, and any one rank's
    copy — or their average — would be another model than the one that trained, so a drifted
    checkpoint is refused with the parameter's name.
    """
    from training.model import Bloom, full_shapes

    step_dir = Path(ckpt_dir)
    meta = read_meta(step_dir)
    check_files(step_dir, meta)
    cfg = model_config(meta)
    rules = meta["tp_rules"]
    ranks = [_rank_weights(step_dir, meta, r) for r in range(meta["layout"]["tp"])]
    shapes = full_shapes(cfg)
    for weights, where in ranks:
        missing, extra = sorted(set(shapes) - set(weights)), sorted(set(weights) - set(shapes))
        if missing or extra:
            raise CheckpointError(f"{where}: parameters missing {missing[:3]}, unexpected {extra[:3]}")
    merged: dict[str, torch.Tensor] = {}
    for name in shapes:
        parts = [w[name] for w, _ in ranks]
        dim = rules[name]
        bad = first_mismatch(parts) if dim is None else None
        if bad is not None:
            diff = (parts[bad].float() - parts[0].float()).abs().max().item()
            raise CheckpointError(
                f"{step_dir}: parameter {name} differs between TP rank 0 and TP rank {bad} (max |difference| "
                f"{diff:.3g}); it should be identical on every TP rank. The replicas drifted apart (as "
                f"BLOOM-176B's LayerNorms did under bf16), so no single copy is the model that trained"
            )
        whole = tp_merge(name, parts, dim, rows=shapes[name][0])
        if whole.shape != shapes[name]:
            raise CheckpointError(
                f"{step_dir}: parameter {name} merges to {tuple(whole.shape)}, the model "
                f"{layout_label(meta['layout'])} wants {tuple(shapes[name])}"
            )
        merged[name] = whole
    with torch.device("meta"):
        model = Bloom(cfg)
    model.to_empty(device="cpu")
    model.load_state_dict(merged, strict=True)
    return model.to(dtype).eval(), meta
