"""Starting a run from existing weights (``train.init_from``): a Hugging Face BLOOM folder or a
bloomline checkpoint, loaded into any TP×PP×DP layout and ZeRO stage; weights only (a fresh
optimizer, schedule and data order).

What is read, and how:

* A Hugging Face folder: ``config.json`` (``model_type: bloom``) and its weights, as
  ``model.safetensors`` or shards listed by ``model.safetensors.index.json``; a folder that has
  only ``pytorch_model*.bin`` pickles is read through the safe loader (training/checkpoint/
  safe_load.py), which runs no code. Names map through training/hf/names.py.
* A bloomline checkpoint (``RUN_DIR/checkpoints/step_N``, or a run folder: its latest), of any
  layout, through the loader that merges its TP slices (training/checkpoint/load.py).

Each rank reads only the tensors of the layers it holds, one at a time (memory-mapped
safetensors, or one pipeline layer of a checkpoint), and cuts its slice of each
(training/parallel/parallelize.py ``build_on_device``), so no rank holds the whole model.

The model's shape comes from the source: a recipe value that differs (hidden size, layers,
heads, MLP width, LayerNorm epsilon) is refused in one line before any rank starts
(:func:`check_init_from`), as is a data tokenizer that does not fit the embedding. The source's
embedding rows past the tokenizer's vocabulary are padding and are dropped, as the export drops
ours (training/hf/to_hf.py); the layout pads its own. A tokenizer grown with ``tokenizer.extend_with``
(data_prep/passes/byte_bpe.py) gets a row per new token: the mean of the source's rows of the
pieces the base tokenizer cut that token into. That is Fast Vocabulary Transfer (Gee et al.,
2022, "Fast Vocabulary Transfer for Language Model Compression", EMNLP industry track): the new
token starts where the model already placed its spelling, and since BLOOM ties its output
projection to the embedding, its first logits are those of its pieces' average, not noise
(Hewitt, 2021, "Initializing New Word Embeddings for Pretrained Language Models", shows random
rows far from the others wreck the output distribution).
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from functools import lru_cache
from pathlib import Path
from typing import Any, Callable, Optional

import torch

from bloomline.errors import CheckpointError, ConfigError
from bloomline.io import sha256_file, sha256_tree
from bloomline.names import confined
from training.config import ModelConfig
from training.hf.names import TIED_HEAD, bloom_name
from training.parallel.layout import EMBEDDING

SHAPE_KEYS = ("hidden_size", "num_layers", "num_heads", "ffn_mult", "layernorm_eps")
"""The model values the weights fix; the recipe's must be equal."""
_HF_KEYS = {  # ours → the BloomConfig keys that may hold it (older configs use the first names)
    "hidden_size": ("n_embed", "hidden_size"),
    "num_layers": ("n_layer", "num_hidden_layers"),
    "num_heads": ("n_head", "num_attention_heads"),
    "layernorm_eps": ("layer_norm_epsilon",),
    "rows": ("vocab_size",),
}


@dataclass
class Source:
    """Existing weights, opened (nothing read yet but their description)."""

    path: Path
    kind: str
    """``hf`` or ``bloomline``."""
    shape: dict[str, Any]
    """The :data:`SHAPE_KEYS` values of the weights."""
    rows: int
    """Rows of the source's embedding (its vocabulary, padding included)."""
    files: list[Path]
    """The files holding the weights (what :meth:`digest` hashes)."""
    tensor: Callable[[str], torch.Tensor] = field(repr=False)
    """A whole tensor by Bloom name, as stored (the embedding with ``rows`` rows)."""
    tokenizer: Optional[Path] = None
    """A tokenizer.json in the folder, if any: the data must have been tokenized with it."""

    def digest(self) -> str:
        """sha256 over the weight files (their names and sha256s): what the checkpoint records."""
        return sha256_tree([[f.name, sha256_file(f)] for f in sorted(self.files)])

    def record(self) -> dict[str, Any]:
        """The checkpoint metadata's ``init_from`` (training/CHECKPOINT.md)."""
        return {"path": str(self.path.resolve()), "kind": self.kind, "sha256": self.digest()}


def open_source(path: str | Path, setting: str = "train.init_from") -> Source:
    """The weights ``setting`` names (``train.init_from``, or ``evaluate --model``); CheckpointError
    in one line, naming ``setting``, for anything else."""
    p = Path(path)
    if not p.exists():
        raise CheckpointError(f"{setting}: {p} not found")
    if (p / "config.json").is_file():
        return _hf_source(p, setting)
    from training.checkpoint.run_dir import META_FILE, RunDir

    if not (p / META_FILE).is_file() and RunDir(p).latest_step() is not None:
        p = RunDir(p).step_dir(RunDir(p).latest_step())  # type: ignore[arg-type]
    if (p / META_FILE).is_file():
        return _bloomline_source(p)
    raise CheckpointError(
        f"{setting}: {p} is neither a Hugging Face BLOOM folder (config.json) nor a bloomline "
        f"checkpoint (RUN_DIR/checkpoints/step_N, or its run folder)"
    )


def _hf_source(p: Path, setting: str) -> Source:
    try:
        conf = json.loads((p / "config.json").read_text(encoding="utf-8"))
    except ValueError as e:
        raise CheckpointError(f"{p / 'config.json'} is not JSON: {e}") from None
    if conf.get("model_type") != "bloom":
        raise CheckpointError(f"{setting}: {p} holds a '{conf.get('model_type')}' model, not BLOOM")
    if conf.get("apply_residual_connection_post_layernorm") or conf.get("tie_word_embeddings") is False:
        raise CheckpointError(
            f"{setting}: {p} is a BLOOM variant bloomline does not train (post-LayerNorm residual or untied head)"
        )
    found = {k: next((conf[n] for n in names if n in conf), None) for k, names in _HF_KEYS.items()}
    if None in found.values():
        raise CheckpointError(f"{p / 'config.json'} lacks {[_HF_KEYS[k][-1] for k, v in found.items() if v is None]}")
    where = _hf_weights(p, setting)
    files = sorted(set(where.values()))
    shape = {k: found[k] for k in SHAPE_KEYS if k in found} | {"ffn_mult": 4}  # HF BLOOM's MLP is 4 x hidden

    def tensor(name: str) -> torch.Tensor:
        if name not in where:
            raise CheckpointError(f"{setting}: {p} has no weights for {name}")
        return _read(str(where[name]), name)

    tok = p / "tokenizer.json"
    return Source(p, "hf", shape, int(found["rows"]), files, tensor, tok if tok.is_file() else None)


def _hf_weights(p: Path, setting: str) -> dict[str, Path]:
    """Bloom name → the file that holds it, from the index or the single file."""
    for index, single in (
        ("model.safetensors.index.json", "model.safetensors"),
        ("pytorch_model.bin.index.json", "pytorch_model.bin"),
    ):
        if (p / index).is_file():
            names = json.loads((p / index).read_text(encoding="utf-8"))["weight_map"]
            # the index's file names stay inside the folder (bloomline/names.py)
            return _checked(p, {k: confined(p, f, str(p / index)) for k, f in names.items()}, setting)
        if (p / single).is_file():
            return _checked(p, {k: p / single for k in _keys(p / single)}, setting)
    raise CheckpointError(f"{setting}: {p} holds no model.safetensors (nor pytorch_model.bin)")


def _keys(f: Path) -> list[str]:
    if f.suffix == ".safetensors":
        from safetensors import safe_open

        with safe_open(str(f), "pt") as h:
            return list(h.keys())
    return list(_bin(str(f)))


def _checked(p: Path, names: dict[str, Path], setting: str) -> dict[str, Path]:
    """The HF names mapped to ours; one that is neither a parameter nor the tied head is refused."""
    out, unknown = {}, []
    for hf, f in names.items():
        ours = bloom_name(hf)
        if ours is not None:
            out[ours] = f
        elif hf.removeprefix("transformer.") != TIED_HEAD and not hf.endswith("attn.masked_bias"):
            unknown.append(hf)
    if unknown:
        raise CheckpointError(f"{setting}: {p} holds weights that are not BLOOM's: {unknown[:3]}")
    return out


def _bin(f: str) -> dict[str, torch.Tensor]:
    """A pickled state dict, memory-mapped, read by the loader that runs no code (once per process
    and version of the file)."""
    st = Path(f).stat()
    return _bin_at(f, st.st_mtime_ns, st.st_size)


@lru_cache(maxsize=2)
def _bin_at(f: str, mtime_ns: int, size: int) -> dict[str, torch.Tensor]:
    from training.checkpoint.safe_load import safe_load

    state = safe_load(f, mmap=True)
    if not isinstance(state, dict):
        raise CheckpointError(f"{f}: not a state dict")
    return state


def _read(f: str, name: str) -> torch.Tensor:
    """The tensor of Bloom parameter ``name`` in file ``f``, as fp32 (named with or without the
    ``transformer.`` prefix)."""
    from training.hf.names import PREFIX, hf_name

    names = (hf_name(name), hf_name(name).removeprefix(PREFIX))
    if f.endswith(".bin"):
        state = _bin(f)
        return state[next(k for k in names if k in state)].float()
    from safetensors import safe_open

    with safe_open(f, "pt") as h:
        keys = set(h.keys())
        return h.get_tensor(next(k for k in names if k in keys)).float()


def _bloomline_source(step_dir: Path) -> Source:
    from training.checkpoint.load import check_files, layer_of, merged_weights
    from training.checkpoint.meta import model_config, read_meta

    meta = read_meta(step_dir)
    check_files(step_dir, meta)
    cfg = model_config(meta)

    @lru_cache(maxsize=1)  # a rank asks for a layer's tensors one after another
    def layer(name: str) -> dict[str, torch.Tensor]:
        return merged_weights(step_dir, meta, {name})

    def tensor(name: str) -> torch.Tensor:
        t = layer(layer_of(name))[name].float()
        return t[: cfg.vocab_size] if name == EMBEDDING else t

    files = sorted([*step_dir.glob("*model_states.pt")])
    shape = {k: getattr(cfg, k) for k in SHAPE_KEYS}
    return Source(step_dir, "bloomline", shape, int(cfg.vocab_size or 0), files, tensor)  # type: ignore[arg-type]


def check_init_from(model: ModelConfig, tokenizer: dict[str, Any], path: str | Path, data_dir: Path) -> Source:
    """Before any rank starts: the recipe's model is the source's shape, and the data's tokenizer
    (``tokenizer``: the manifest entry of ``data_dir``) fits the source's embedding — it is the
    model's own, or one grown from it, with its extension file. ConfigError naming the key to change."""
    src = open_source(path)
    for k in SHAPE_KEYS:
        if getattr(model, k) != src.shape[k]:
            raise ConfigError(
                f"model.{k}",
                f"is {getattr(model, k)}, the weights in {src.path} have {src.shape[k]}: set -o model.{k}={src.shape[k]} "
                f"(or a model recipe of their shape)",
            )
    ext = tokenizer.get("extends")
    if ext and not (ext.get("file") and extension_file(data_dir, ext).is_file()):
        raise ConfigError(
            "train.init_from",
            f"the data's tokenizer was grown, but {data_dir} lacks the file that says how "
            f"({ext.get('file', 'extends.file: not recorded')}): prepare the data again",
        )
    base = int((ext or {}).get("base_vocab_size", tokenizer["vocab_size"]))
    if base > src.rows:
        raise ConfigError(
            "train.init_from",
            f"the data's tokenizer has {base} tokens{' before it was grown' if tokenizer.get('extends') else ''}, the "
            f"embedding in {src.path} has {src.rows} rows: prepare the data with the model's tokenizer "
            f"(-o tokenizer.model={src.path})",
        )
    if src.tokenizer is not None:
        own = sha256_file(src.tokenizer)
        if own not in (tokenizer["sha256"], (tokenizer.get("extends") or {}).get("base_sha256")):
            raise ConfigError(
                "train.init_from",
                f"the data was tokenized with another tokenizer than {src.tokenizer}: prepare it with "
                f"-o tokenizer.model={src.path} (or grow that one with tokenizer.extend_with)",
            )
    return src


def extension_file(data_dir: Path, ext: dict[str, Any]) -> Path:
    """The grown tokenizer's extension file the manifest names (``extends.file``), confined to the
    data folder (bloomline/names.py)."""
    return confined(data_dir, ext.get("file", ""), str(data_dir / "manifest.json") + " (tokenizer.extends.file)")


def init_weights(
    src: Source, model: ModelConfig, tokenizer: dict[str, Any], data_dir: Path
) -> Callable[[str], torch.Tensor]:
    """The whole fp32 tensor of each parameter by name, for ``parallelize(init=...)``: the source's,
    its embedding cut to the tokenizer's vocabulary, with a row per token a grown tokenizer added
    (module docstring)."""
    ext = tokenizer.get("extends")
    base = int(ext["base_vocab_size"]) if ext else int(model.vocab_size or 0)
    added: list[list[int]] = []
    if ext:
        f = extension_file(data_dir, ext)
        added = [t["base_pieces"] for t in sorted(json.loads(f.read_text())["tokens"], key=lambda t: t["id"])]

    def tensor(name: str) -> torch.Tensor:
        t = src.tensor(name)
        if name != EMBEDDING:
            return t
        t = t[:base]
        if added:
            t = torch.cat([t, torch.stack([t[pieces].mean(0) for pieces in added])])
        return t

    return tensor


def start_from(
    recipe: Any, manifest: dict[str, Any], data_dir: Path, rank: int
) -> tuple[Callable[[str], torch.Tensor], Optional[dict[str, Any]]]:
    """A fresh run's ``train.init_from``: its weights by name (:func:`init_weights`), and on rank 0
    the checkpoint metadata's record of them (their sha256 hashed once, there)."""
    src = open_source(recipe.train.init_from)
    return init_weights(src, recipe.model, manifest["tokenizer"], data_dir), (src.record() if rank == 0 else None)
