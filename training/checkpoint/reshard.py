"""Resume on another TP / PP / DP / ZeRO layout by converting through a layout-independent checkpoint.

A DeepSpeed checkpoint is sharded by the layout that wrote it: ZeRO partitions the optimizer
state over DP ranks, TP ranks hold slices of the weights, PP stages hold their layers. To resume
with another layout, ``convert`` turns ``checkpoints/step_N`` into ``checkpoints/step_N/universal``
with DeepSpeed's *universal checkpoint* converter (``deepspeed.checkpoint.ds_to_universal``,
written for BLOOM-176B's own topology changes): one folder per parameter holding the whole fp32
master weight and its Adam moments, TP slices merged, ZeRO partitions joined. Ranks of the new
layout then load it with ``checkpoint.load_universal``, each cutting its own slice.

Two things are ours, both derived from ``training/parallel/layout.py``:

* How our TP slices merge (:func:`~training.parallel.layout.universal_info`): the exact parameter names of the writing
  layout, grouped by their cut (``layout.tp_dim``: replicated, row-parallel, vocabulary).
* Parameter names depend on the layout (a ``PipelineModule`` names layers by index), and
  DeepSpeed finds a parameter's folder by its name in the loading model, so ``convert`` stores
  the folders under the target layout's names.

``bloomline train`` runs the conversion before starting the ranks when the recipe's layout differs
from the checkpoint's; ``python -m training.checkpoint.reshard`` runs it by hand.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import shutil
import sys
from pathlib import Path
from typing import Any, Iterator

from bloomline.host import available_cpus
from training.checkpoint.meta import model_config, read_meta
from training.checkpoint.safe_load import check_folder, enforced, safe_load
from training.parallel.layout import EMBEDDING, LAYOUT_KEYS, bloom_name, layout_label, layout_name, tp_dim

MARKER = "bloomline_layout.json"  # in step_N/universal: written last, says which layout it is laid out for


def check_convertible(step_dir: Path, meta: dict[str, Any], target: dict[str, int]) -> None:
    """Raise ValueError for a layout change we cannot make (``meta``: the step's bloomline.json).

    * ZeRO stages 1, 2 and 3, in any direction; a ZeRO-3 side with tp=1. DeepSpeed 0.19 converts
      and loads ZeRO-3's universal form in another shape than ZeRO-1/2's (:func:`_zero3_form` puts
      it in the target's); its ZeRO-3 converter does not merge TP slices.
    * Not ZeRO-0: no ZeRO optimizer, so DeepSpeed neither writes the partitioned state the
      converter reads nor loads weights from a universal checkpoint.
    * No optimizer step taken yet (every step skipped, e.g. fp16 overflows): there are no Adam
      moments to convert, and DeepSpeed's converter fails on their absence."""
    source = meta["layout"]
    if source["zero_stage"] not in (1, 2, 3) or target["zero_stage"] not in (1, 2, 3):
        raise ValueError(
            f"{step_dir} (zero_stage={source['zero_stage']}) cannot be resumed with zero_stage="
            f"{target['zero_stage']} and another layout: layout changes work between ZeRO stages 1, 2 "
            f"and 3; otherwise resume with the same tp/pp/dp/zero_stage"
        )
    for side, layout in (("the checkpoint", source), ("this run", target)):
        if layout["zero_stage"] == 3 and layout["tp"] > 1:
            raise ValueError(
                f"{step_dir}: {side} has zero_stage=3 with tp={layout['tp']}: a layout change with ZeRO-3 "
                f"works at tp=1; resume with the same tp/pp/dp/zero_stage"
            )
    t = meta["trainer"]
    if int(meta["step"]) - int(t.get("skipped", 0)) - int(t.get("fp16_overflows", 0)) <= 0:
        raise ValueError(
            f"{step_dir}: every step so far was skipped, so there is no optimizer state to convert to "
            f"another layout; resume with the same tp/pp/dp/zero_stage"
        )


def reshard_command(step_dir: str | Path, layout: dict[str, int]) -> list[str]:
    """``python -m training.checkpoint.reshard STEP_DIR --tp .. --pp .. --dp .. --zero-stage ..``"""
    cmd = [sys.executable, "-m", "training.checkpoint.reshard", str(step_dir)]
    for k in LAYOUT_KEYS:
        cmd += [f"--{k.replace('_', '-')}", str(layout[k])]
    return cmd


def has_universal(step_dir: Path, layout: dict[str, int]) -> bool:
    """``step_dir/universal`` is complete and laid out for ``layout``."""
    try:
        return json.loads((step_dir / "universal" / MARKER).read_text()).get("layout") == layout
    except (OSError, ValueError, AttributeError):
        return False  # absent, or damaged: convert again


def convert(step_dir: str | Path, layout: dict[str, int]) -> Path:
    """``step_dir`` (any layout) → ``step_dir/universal`` laid out for ``layout``; idempotent.

    Written to ``universal.tmp`` and renamed, with the marker written last: a killed conversion
    leaves nothing that looks finished."""
    from deepspeed.checkpoint import ds_to_universal

    step_dir = Path(step_dir)
    out = step_dir / "universal"
    if has_universal(step_dir, layout):
        return out
    meta = read_meta(step_dir)
    model = model_config(meta)
    source = meta["layout"]
    check_convertible(step_dir, meta, layout)
    check_folder(step_dir, recursive=False)  # a file that names code: refused in one line, up front
    tmp = step_dir / "universal.tmp"
    # The converter globs the step folder for model-state files, so no earlier output may stay inside it.
    shutil.rmtree(tmp, ignore_errors=True)
    shutil.rmtree(out, ignore_errors=True)
    workers = max(1, min(8, available_cpus() - 1))
    args = argparse.Namespace(
        input_folder=str(_converter_input(step_dir, tmp / "source")),
        output_folder=str(tmp),
        num_extract_workers=workers,
        num_merge_workers=max(1, workers // 4),
        keep_temp_folder=False,
        strict=True,
        inject_missing_state=False,
    )  # every checkpoint carries universal_info
    try:  # its loads ask for weights_only=False; its workers fork from here, so they load as this process does
        with enforced(), _forked_workers():
            ds_to_universal.main(args)
    except AssertionError as e:
        raise RuntimeError(f"DeepSpeed's universal converter refused {step_dir}: {e}") from e
    finally:
        shutil.rmtree(tmp / "source", ignore_errors=True)

    # Folders under the target layout's names; rows of the vocabulary trimmed to its padding.
    zero, staged = tmp / "zero", tmp / "zero.renamed"
    staged.mkdir()
    target_vocab = model.padded_vocab(tp=layout["tp"])
    for d in sorted(p for p in zero.iterdir() if p.is_dir()):
        name = layout_name(bloom_name(d.name, model.num_layers), layout, model.num_layers)
        d.rename(staged / name)
        if name.endswith("word_embeddings.weight"):
            _trim_vocab(staged / name, target_vocab)
    for f in zero.iterdir():  # optimizer_state.pt and anything else that is not a parameter
        if f.is_file():
            f.rename(staged / f.name)
    shutil.rmtree(zero)
    staged.rename(zero)
    _strip_model_states(tmp)
    _name_model_states(tmp, source, layout)
    _zero3_form(tmp / "zero", source, layout, model)
    (tmp / MARKER).write_text(json.dumps({"layout": layout, "source_layout": source, "step": meta["step"]}))
    os.replace(tmp, out)
    # the converter also writes a 'latest_universal' pointer (to universal.tmp) we do not use
    (step_dir / "latest_universal").unlink(missing_ok=True)
    return out


@contextlib.contextmanager
def _forked_workers() -> Iterator[None]:
    """Within the block, multiprocessing's default start method is 'fork'. ``ds_to_universal`` starts
    its extract and merge workers (when told to use more than one) with
    ``ProcessPoolExecutor(max_workers=n)``, no context given: by the default method.
    :func:`~training.checkpoint.safe_load.enforced` patches ``torch.load`` in this process, and only
    a forked worker inherits the patch; one started by 'spawn' or 'forkserver' (Python 3.14's default
    on Linux) imports torch afresh and would load every file with ``weights_only=False``."""
    import multiprocessing

    before = multiprocessing.get_start_method(allow_none=True)
    multiprocessing.set_start_method("fork", force=True)
    try:
        yield
    finally:
        multiprocessing.set_start_method(before, force=True)  # None: unset again, as it was


def _converter_input(step_dir: Path, staged: Path) -> Path:
    """The folder to hand ``ds_to_universal``: ``step_dir``, or, when a rank's model state holds
    entries that are not tensors, ``staged``: the same files (linked), those entries dropped.

    megatron-core's TP linears save an ``_extra_state`` of None (``get_extra_state``), so every
    checkpoint with tp > 1 and pp = 1 (whose model-state files hold the weights) has them. DeepSpeed
    0.19.8's converter (``ds_to_universal.main``, ZeRO-1/2, after merging the TP slices) writes
    ``zero/NAME/fp32.pt`` for each ``module`` entry without one, as ``{"param": entry.float()}``,
    for parameters that had no optimizer state: an entry that is no tensor fails there,
    "'NoneType' object has no attribute 'float'", whatever the precision or optimizer. The entries
    carry nothing (load.py drops them too), and every parameter has optimizer state, so the
    converter's output is otherwise unchanged. A pipeline checkpoint's model states hold no weights
    (``module`` None); ZeRO-3's are read by another path."""
    import torch

    rewrite = {}
    for f in sorted(step_dir.glob("mp_rank_*_model_states.pt")):  # DeepSpeed's mp_rank_files
        sd = safe_load(f, mmap=True)
        module = sd.get("module")
        if isinstance(module, dict) and not all(isinstance(v, torch.Tensor) for v in module.values()):
            sd["module"] = type(module)((k, v) for k, v in module.items() if isinstance(v, torch.Tensor))
            rewrite[f.name] = sd
    if not rewrite:
        return step_dir
    staged.mkdir(parents=True)
    for f in step_dir.iterdir():
        if f.name in rewrite:
            torch.save(rewrite[f.name], staged / f.name)
        elif f.is_file():
            (staged / f.name).symlink_to(f.resolve())
    return staged


def _strip_model_states(folder: Path) -> None:
    """The converter copies the source's model-state files, whole weights included. The loader
    reads only run metadata from them (our step, sampler and RNG state) and the weights from
    ``zero/``, but it would still load the weights onto the *source* rank's GPU (map_location
    keeps devices). Keep the metadata, on CPU."""
    import torch

    for f in folder.glob("*model_states.pt"):
        sd = safe_load(f)
        sd["module"] = None
        torch.save(sd, f)


def _rank_files(layout: dict[str, int]) -> list[str]:
    """The per-rank model-state files DeepSpeed reads for ``layout``: ZeRO-3 names one per DP and
    TP rank, the other stages one per model-parallel rank."""
    if layout["zero_stage"] == 3:
        return [
            f"zero_pp_rank_{d}_mp_rank_{t:02d}_model_states.pt"
            for d in range(layout["dp"])
            for t in range(layout["tp"])
        ]
    return [f"mp_rank_{t:02d}_model_states.pt" for t in range(layout["tp"])]


def _name_model_states(folder: Path, source: dict[str, int], target: dict[str, int]) -> None:
    """The run metadata under the file names the target layout's ranks read, when ZeRO-3 on either
    side changes how they are named (the metadata is the same on every rank: rank 0's). Its
    ``mp_world_size`` becomes the target's tp: DeepSpeed's loader requires it to equal the number of
    model-state files it finds, here one per target TP rank (a tp change with ZeRO-3 on one side
    failed on it: "checkpoint count 1 is different from saved mp_world_size 2")."""
    import torch

    if 3 not in (source["zero_stage"], target["zero_stage"]):
        return  # the same names: the converter's copies stand (PP's per-stage files included)
    sd = safe_load(folder / _rank_files(source)[0])
    if "mp_world_size" in sd:
        sd["mp_world_size"] = target["tp"]
    for name in _rank_files(source):
        (folder / name).unlink(missing_ok=True)
    for name in _rank_files(target):
        torch.save(sd, folder / name)


def _zero3_form(zero: Path, source: dict[str, int], target: dict[str, int], model: Any) -> None:
    """The universal form in the shape the target's loader reads, when ZeRO-3 is on one side
    (between ZeRO-1 and 2 nothing changes). DeepSpeed 0.19 writes and reads it in two shapes
    (measured here): a ZeRO-3 source's parameter files hold flat tensors and no ``step.pt``, and its
    ``zero/optimizer_state.pt`` keeps the Adam step and the hyperparameters under
    ``optimizer_state_dict``; the ZeRO-1/2 loader reads ``{"param": whole tensor, "cat_dim": ...}``,
    each parameter's ``step.pt``, and ``param_groups`` and ``ds_version`` at the top; the ZeRO-3
    loader reads either tensor form and the step under ``optimizer_state_dict``."""
    import deepspeed
    import torch
    from deepspeed.checkpoint import constants as c

    from training.model.bloom import full_shapes

    if 3 not in (source["zero_stage"], target["zero_stage"]):
        return
    path = zero / "optimizer_state.pt"
    sd = safe_load(path)
    params = sorted(d for d in zero.iterdir() if d.is_dir())
    nested = sd.get(c.OPTIMIZER_STATE_DICT) or {}
    step = nested["state"][0]["step"] if "state" in nested else safe_load(params[0] / "step.pt")
    groups = sd.get("param_groups") or nested["param_groups"]
    out = {k: sd[k] for k in (c.LOSS_SCALER, "dynamic_loss_scale", "overflow", c.CLIP_GRAD) if k in sd}
    out["param_groups"] = groups
    if target["zero_stage"] == 3:
        out[c.OPTIMIZER_STATE_DICT] = {"state": {0: {"step": step}}, "param_groups": groups}
    else:
        out[c.DS_VERSION] = sd.get(c.DS_VERSION) or deepspeed.__version__
        shapes = full_shapes(model)  # a ZeRO-3 source has tp=1 (check_convertible)
        for d in params:
            name = bloom_name(d.name, model.num_layers)
            for key in ("fp32", "exp_avg", "exp_avg_sq"):
                t = safe_load(d / f"{key}.pt")
                if isinstance(t, torch.Tensor):  # flat: whole, with the cut the TP loader slices by
                    entry: dict[str, Any] = {c.PARAM: t.view(shapes[name])}
                    if tp_dim(name) is not None:
                        entry[c.CAT_DIM] = tp_dim(name)
                    if name == EMBEDDING:
                        entry[c.VOCAB_TENSOR] = True
                    torch.save(entry, d / f"{key}.pt")
            if not (d / "step.pt").exists():
                torch.save(step, d / "step.pt")
    torch.save(out, path)


def _trim_vocab(folder: Path, rows: int) -> None:
    """Drop padding rows beyond the target's padded vocabulary (only when it pads less)."""
    import torch

    for f in folder.glob("*.pt"):
        d = safe_load(f)
        if isinstance(d, dict) and "param" in d and d["param"].dim() == 2 and d["param"].shape[0] > rows:
            d["param"] = d["param"][:rows].clone()
            torch.save(d, f)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(
        description="Lay a checkpoint out for another TP/PP/DP/ZeRO layout "
        "(step_N/universal, loaded by a resuming run of that layout)."
    )
    ap.add_argument("step_dir", help="RUN_DIR/checkpoints/step_N")
    for k in LAYOUT_KEYS:
        ap.add_argument(f"--{k.replace('_', '-')}", type=int, required=True)
    args = ap.parse_args(argv)
    layout = {k: getattr(args, k) for k in LAYOUT_KEYS}
    out = convert(Path(args.step_dir), layout)
    print(f"{out}: laid out for {layout_label(layout)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
