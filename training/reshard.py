"""Resume on another TP / PP / DP / ZeRO layout by converting through a layout-independent checkpoint.

A DeepSpeed checkpoint is sharded by the layout that wrote it: ZeRO partitions the optimizer
state over DP ranks, TP ranks hold slices of the weights, PP stages hold their layers. To resume
with another layout, ``convert`` turns ``checkpoints/step_N`` into ``checkpoints/step_N/universal``
with DeepSpeed's *universal checkpoint* converter (``deepspeed.checkpoint.ds_to_universal``,
written for BLOOM-176B's own topology changes): one folder per parameter holding the whole fp32
master weight and its Adam moments, TP slices merged, ZeRO partitions joined. Ranks of the new
layout then load it with ``checkpoint.load_universal``, each cutting its own slice.

Two things are ours:

* How our TP slices merge (``universal_info``): column-parallel weights and biases (qkv, fc1) and
  the vocabulary-parallel embedding are cut along dim 0, row-parallel weights (dense, fc2) along
  dim 1, LayerNorms and row-parallel biases are replicated. The fused qkv rows are laid out per
  head (``training/model.py``), so a dim-0 slice is whole heads for any TP.
* Parameter names depend on the layout (a ``PipelineModule`` names layers by index, the TP
  wrapper adds ``.inner``), and DeepSpeed finds a parameter's folder by its name in the loading
  model. ``canonical_name`` maps any layout's name to the single-device one and
  ``layout_name`` back, and ``convert`` stores the folders under the target layout's names.

``bloomline train`` runs the conversion before starting the ranks when the recipe's layout differs
from the checkpoint's; ``python -m training.reshard`` runs it by hand.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import sys
from pathlib import Path
from typing import Any

from bloomline.config import from_dict
from training.config import ModelConfig

LAYOUT_KEYS = ("tp", "pp", "dp", "zero_stage")
MARKER = "bloomline_layout.json"  # in step_N/universal: written last, says which layout it is laid out for
_TP_LINEARS = re.compile(r"^(.*\.(?:qkv|dense|fc1|fc2))\.(weight|bias)$")


def layout_of(parallel: Any) -> dict[str, int]:
    """The layout part of a ParallelConfig (or of its dict in a checkpoint's config)."""
    get = parallel.get if isinstance(parallel, dict) else lambda k: getattr(parallel, k)
    return {k: int(get(k)) for k in LAYOUT_KEYS}


def universal_info(padded_vocab: int) -> dict[str, Any]:
    """How DeepSpeed's converter merges our TP slices (saved in every checkpoint).

    ``original_vocab_size`` is the padded vocabulary of the writing layout: the converter keeps
    those rows (padding rows included, so a same-size resume is exact) and the loader pads with
    zeros when the new layout pads further."""
    from deepspeed.checkpoint import constants as c

    return {
        c.UNIVERSAL_CHECKPOINT_VERSION_KEY: c.UNIVERSAL_CHECKPOINT_VERSION_VALUE,
        c.TP_REPLICATED_PARAMETER_PATTERNS: [r".*(embed_ln|final_ln|ln1|ln2)\.(weight|bias)$",
                                             r".*(dense|fc2)(\.inner)?\.bias$"],
        c.PARAMETER_WITH_ROW_PARALLELISM_PATTERNS: [r".*(dense|fc2)(\.inner)?\.weight$"],
        c.VOCABULARY_PARAMETER_PATTERNS: [r".*word_embeddings\.weight$"],
        # tied: held by the first and the last pipeline stage; the converter takes the first's
        c.PIPELINE_REPLICATED_PARAMETER_PATTERNS: [r".*word_embeddings\.weight$"],
        c.ORIGINAL_VOCAB_SIZE: int(padded_vocab),
    }


def canonical_name(name: str) -> str:
    """A parameter's name in the single-device model (``SequentialBloom`` at TP=1)."""
    name = name.replace(".inner.", ".")
    if name.startswith("tied_modules.embed."):
        return "embedding." + name[len("tied_modules.embed."):]
    m = re.match(r"^(\d+)\.(embed_ln|block|final_ln)\.(.*)$", name)
    if m:
        idx, kind, rest = int(m.group(1)), m.group(2), m.group(3)
        # PipelineModule indices: 0 embedding (tied), 1 embed norm, 2..L+1 blocks, L+2 final norm
        if kind == "block":
            return f"blocks.{idx - 2}.block.{rest}"
        return f"{'embed_norm' if kind == 'embed_ln' else 'final_norm'}.{kind}.{rest}"
    return name


def layout_name(canonical: str, tp: int, pp: int, num_layers: int) -> str:
    """The inverse of ``canonical_name`` for a layout (see ``layer_specs`` / ``SequentialBloom``)."""
    name = canonical
    if tp > 1:
        m = _TP_LINEARS.match(name)
        if m:
            name = f"{m.group(1)}.inner.{m.group(2)}"
    if pp > 1:
        if name.startswith("embedding."):
            return "tied_modules.embed." + name[len("embedding."):]
        if name.startswith("embed_norm."):
            return "1." + name[len("embed_norm."):]
        if name.startswith("final_norm."):
            return f"{num_layers + 2}." + name[len("final_norm."):]
        m = re.match(r"^blocks\.(\d+)\.(.*)$", name)
        if m:
            return f"{int(m.group(1)) + 2}.{m.group(2)}"
    return name


def check_convertible(step_dir: Path, meta: dict[str, Any], target: dict[str, int]) -> None:
    """Raise ValueError for a layout change we cannot make (``meta``: the step's bloomline.json).

    * Only between ZeRO stages 1 and 2. ZeRO-3: DeepSpeed 0.19 converts such a checkpoint, but its
      ZeRO-1/2 loader rejects the result (no ds_version in the merged optimizer state) and its
      ZeRO-3 loader expects per-rank optimizer files a universal checkpoint lacks (measured here).
      ZeRO-0: no ZeRO optimizer, so DeepSpeed neither writes the partitioned state the converter
      reads nor loads weights from a universal checkpoint.
    * No optimizer step taken yet (every step skipped, e.g. fp16 overflows): there are no Adam
      moments to convert, and DeepSpeed's converter fails on their absence."""
    source = layout_of(meta["config"]["parallel"])
    if source["zero_stage"] not in (1, 2) or target["zero_stage"] not in (1, 2):
        raise ValueError(f"{step_dir} (zero_stage={source['zero_stage']}) cannot be resumed with zero_stage="
                         f"{target['zero_stage']} and another layout: layout changes work between ZeRO stages 1 "
                         f"and 2; otherwise resume with the same tp/pp/dp/zero_stage")
    if int(meta["step"]) - int(meta.get("skipped", 0)) - int(meta.get("fp16_overflows", 0)) <= 0:
        raise ValueError(f"{step_dir}: every step so far was skipped, so there is no optimizer state to convert to "
                         f"another layout; resume with the same tp/pp/dp/zero_stage")


def reshard_command(step_dir: str | Path, layout: dict[str, int]) -> list[str]:
    """``python -m training.reshard STEP_DIR --tp .. --pp .. --dp .. --zero-stage ..``"""
    cmd = [sys.executable, "-m", "training.reshard", str(step_dir)]
    for k in LAYOUT_KEYS:
        cmd += [f"--{k.replace('_', '-')}", str(layout[k])]
    return cmd


def is_ready(step_dir: Path, layout: dict[str, int]) -> bool:
    marker = step_dir / "universal" / MARKER
    return marker.is_file() and json.loads(marker.read_text()).get("layout") == layout


def convert(step_dir: str | Path, layout: dict[str, int], model: ModelConfig) -> Path:
    """``step_dir`` (any layout) → ``step_dir/universal`` laid out for ``layout``; idempotent.

    Written to ``universal.tmp`` and renamed, with the marker written last: a killed conversion
    leaves nothing that looks finished."""
    from deepspeed.checkpoint import ds_to_universal

    step_dir = Path(step_dir)
    out = step_dir / "universal"
    if is_ready(step_dir, layout):
        return out
    meta = json.loads((step_dir / "bloomline.json").read_text())
    source = layout_of(meta["config"]["parallel"])
    check_convertible(step_dir, meta, layout)
    tmp = step_dir / "universal.tmp"
    # The converter globs the step folder for model-state files, so no earlier output may stay inside it.
    shutil.rmtree(tmp, ignore_errors=True)
    shutil.rmtree(out, ignore_errors=True)
    workers = max(1, min(8, (os.cpu_count() or 1) - 1))
    args = argparse.Namespace(input_folder=str(step_dir), output_folder=str(tmp), num_extract_workers=workers,
                              num_merge_workers=max(1, workers // 4), keep_temp_folder=False, strict=True,
                              # checkpoints from before universal_info was saved: fine without TP slices
                              inject_missing_state=source["tp"] == 1)
    try:
        ds_to_universal.main(args)
    except AssertionError as e:
        raise RuntimeError(f"DeepSpeed's universal converter refused {step_dir}: {e}") from e

    # Folders under the target layout's names; rows of the vocabulary trimmed to its padding.
    zero, staged = tmp / "zero", tmp / "zero.renamed"
    staged.mkdir()
    target_vocab = model.padded_vocab(tp=layout["tp"])
    for d in sorted(p for p in zero.iterdir() if p.is_dir()):
        name = layout_name(canonical_name(d.name), layout["tp"], layout["pp"], model.num_layers)
        if (staged / name).exists():
            continue  # the tied embedding, saved by both the first and the last stage
        d.rename(staged / name)
        if name.endswith("word_embeddings.weight"):
            _trim_vocab(staged / name, target_vocab)
    for f in zero.iterdir():  # optimizer_state.pt and anything else that is not a parameter
        if f.is_file():
            f.rename(staged / f.name)
    shutil.rmtree(zero)
    staged.rename(zero)
    _strip_model_states(tmp)
    (tmp / MARKER).write_text(json.dumps({"layout": layout, "source_layout": source, "step": meta["step"]}))
    os.replace(tmp, out)
    # the converter also writes a 'latest_universal' pointer (to universal.tmp) we do not use
    (step_dir / "latest_universal").unlink(missing_ok=True)
    return out


def _strip_model_states(folder: Path) -> None:
    """The converter copies the source's model-state files, whole weights included. The loader
    reads only run metadata from them (our step, sampler and RNG state) and the weights from
    ``zero/``, but it would still load the weights onto the *source* rank's GPU (map_location
    keeps devices). Keep the metadata, on CPU."""
    import torch

    for f in folder.glob("*model_states.pt"):
        sd = torch.load(f, map_location="cpu", weights_only=False)
        sd["module"] = None
        torch.save(sd, f)


def _trim_vocab(folder: Path, rows: int) -> None:
    """Drop padding rows beyond the target's padded vocabulary (only when it pads less)."""
    import torch

    for f in folder.glob("*.pt"):
        d = torch.load(f, weights_only=False)
        if isinstance(d, dict) and "param" in d and d["param"].dim() == 2 and d["param"].shape[0] > rows:
            d["param"] = d["param"][:rows].clone()
            torch.save(d, f)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description="Lay a checkpoint out for another TP/PP/DP/ZeRO layout "
                                             "(step_N/universal, loaded by a resuming run of that layout).")
    ap.add_argument("step_dir", help="RUN_DIR/checkpoints/step_N")
    for k in LAYOUT_KEYS:
        ap.add_argument(f"--{k.replace('_', '-')}", type=int, required=True)
    args = ap.parse_args(argv)
    step_dir = Path(args.step_dir)
    meta = json.loads((step_dir / "bloomline.json").read_text())
    layout = {k: getattr(args, k) for k in LAYOUT_KEYS}
    out = convert(step_dir, layout, from_dict(ModelConfig, meta["config"]["model"]))
    print(f"{out}: laid out for {layout}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
