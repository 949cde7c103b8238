"""Loading a checkpoint of any TP/PP/DP/ZeRO layout in one process, with no distributed setup:
:func:`load_model`, the one public loader, returns the whole single-device
:class:`~training.model.bloom.Bloom`; :func:`detect_layout` reads the layout from the files
DeepSpeed wrote, :func:`check_files` that they are all there, :func:`weights_digest` hashes them."""

from __future__ import annotations

import contextlib
import io
import re
import tempfile
from pathlib import Path
from typing import Any, Optional

import torch

from bloomline.errors import CheckpointError
from bloomline.io import sha256_file
from training.checkpoint.meta import PRECISIONS, model_config, read_meta
from training.checkpoint.run_dir import META_FILE
from training.checkpoint.safe_load import enforced, safe_load
from training.parallel.layout import (
    bloom_name,
    first_mismatch,
    layout_label,
    pipeline_prefixes,
    tp_merge,
)


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


def layer_of(name: str) -> str:
    """The pipeline layer (``Bloom.layers()`` name) a parameter belongs to: ``blocks.3.attn.qkv.weight``
    → ``blocks.3``, ``final_ln.bias`` → ``final_ln``."""
    parts = name.split(".")
    return ".".join(parts[:2]) if parts[0] == "blocks" else parts[0]


def _rank_weights(
    step_dir: Path, meta: dict[str, Any], tp_rank: int, layers: Optional[set[str]] = None
) -> tuple[dict[str, torch.Tensor], str]:
    """One TP rank's parameters under Bloom names, and the file(s) they came from; ``layers``: only
    those layers' (:func:`layer_of`), read from their own files where the layout wrote per-layer
    files, else memory-mapped, so the other tensors' bytes are never read."""
    lay, cfg = meta["layout"], model_config(meta)
    wanted = (lambda name: True) if layers is None else (lambda name: layer_of(name) in layers)
    if lay["zero_stage"] == 3:
        weights = _zero3_weights(step_dir, tp_rank, PRECISIONS[meta["precision"]])
        return {k: v for k, v in weights.items() if wanted(k)}, f"{step_dir}/*mp_rank_{tp_rank:02d}*"
    out: dict[str, torch.Tensor] = {}
    if lay["pp"] > 1:
        for idx, prefix in enumerate(pipeline_prefixes(cfg.num_layers)[:-1]):
            if layers is not None and prefix not in layers:
                continue
            f = step_dir / f"layer_{idx:02d}-model_{tp_rank:02d}-model_states.pt"
            layer = safe_load(f)
            if not isinstance(layer, dict):
                raise CheckpointError(f"{f}: no layer weights")
            out.update({f"{prefix}.{k}": v for k, v in layer.items()})
        where = f"{step_dir}/layer_*-model_{tp_rank:02d}-model_states.pt"
    else:
        f = step_dir / f"mp_rank_{tp_rank:02d}_model_states.pt"
        states = safe_load(f, mmap=layers is not None)
        module = states.get("module") if isinstance(states, dict) else None
        if not isinstance(module, dict):
            raise CheckpointError(f"{f}: no module weights")
        out = {n: v for n, v in ((bloom_name(k, cfg.num_layers), v) for k, v in module.items()) if wanted(n)}
        where = str(f)
    # megatron-core layers add an empty '_extra_state' entry; it carries nothing
    return {k: v for k, v in out.items() if not k.endswith("_extra_state")}, where


def _zero3_weights(step_dir: Path, tp_rank: int, dtype: torch.dtype) -> dict[str, torch.Tensor]:
    """ZeRO-3 keeps no whole weights in the model-state files: gather this TP rank's fp32 master
    partitions with DeepSpeed's ``zero_to_fp32`` (which reads one model-parallel rank's files, so
    they are linked into a folder of their own) and round them to the training precision, which
    is what the bf16/fp16 copies the model computed with hold. ``zero_to_fp32`` asks for
    ``weights_only=False``: it runs inside safe_load.enforced, so it gets the restricted unpickler."""
    from deepspeed.utils.zero_to_fp32 import get_fp32_state_dict_from_zero_checkpoint

    with tempfile.TemporaryDirectory() as tmp:
        tag = Path(tmp) / "t"
        tag.mkdir()
        for f in step_dir.glob(f"*mp_rank_{tp_rank:02d}_*.pt"):
            (tag / f.name).symlink_to(f.resolve())
        with (
            enforced(),
            contextlib.redirect_stdout(io.StringIO()),
            contextlib.redirect_stderr(io.StringIO()),
        ):
            sd = get_fp32_state_dict_from_zero_checkpoint(tmp, tag="t")
    return {k: v.to(dtype) for k, v in sd.items()}


def merged_weights(step_dir: Path, meta: dict[str, Any], layers: Optional[set[str]] = None) -> dict[str, torch.Tensor]:
    """The whole tensors (every TP slice of the checkpoint merged) of the model's parameters, or of
    ``layers``' only (:func:`layer_of`), under Bloom names, as the model computed with them.

    Before merging, every parameter that TP ranks hold whole (LayerNorms, row-parallel biases)
    must be equal on all of them: BLOOM-176B's LayerNorms drifted apart across TP ranks under
    bf16, and any one rank's copy — or their average — would be another model than the one that
    trained, so a drifted checkpoint is refused with the parameter's name."""
    from training.model.bloom import full_shapes

    cfg = model_config(meta)
    rules = meta["tp_rules"]
    shapes = {n: s for n, s in full_shapes(cfg).items() if layers is None or layer_of(n) in layers}
    ranks = [_rank_weights(step_dir, meta, r, layers) for r in range(meta["layout"]["tp"])]
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
    return merged


def load_model(
    ckpt_dir: str | Path, dtype: torch.dtype = torch.float32, meta: dict[str, Any] | None = None
) -> tuple[Any, dict[str, Any]]:
    """The whole model of a checkpoint of any layout, as a single-device ``Bloom`` in ``dtype``
    (eval mode, on CPU), and the checkpoint's checked bloomline.json (``meta``: as the caller read
    it already, with :func:`read_meta`).

    TP slices are merged (cuts from the checkpoint's own ``tp_rules``), pipeline stages joined,
    ZeRO-3 partitions gathered (:func:`merged_weights`). The weights are those the model computed
    with at that step (the training precision's copy of the fp32 master weights), converted to
    ``dtype``.
    """
    from training.model.bloom import Bloom

    step_dir = Path(ckpt_dir)
    meta = read_meta(step_dir) if meta is None else meta
    check_files(step_dir, meta)
    merged = merged_weights(step_dir, meta)
    with torch.device("meta"):
        model = Bloom(model_config(meta))
    # the merged tensors become the parameters (assign): no empty copy to fill, whose allocation on
    # the meta model's behalf (torch._refs' empty_like) imports symbolic shapes, 0.7 s of each evaluation
    model.load_state_dict(merged, strict=True, assign=True)
    return model.to(dtype).eval(), meta
