"""Export a checkpoint of any layout as a Hugging Face ``BloomForCausalLM`` (``bloomline export``).

Written: ``model.safetensors`` (safetensors: the format transformers loads without pickle),
``config.json`` (only the fields HF Bloom reads), and the tokenizer the data was tokenized with.
A Hugging Face ``tokenizer.json`` ships unchanged, with the ``tokenizer_config.json`` it came with
(the data folder keeps both): ``AutoTokenizer`` loads the export as it loads the source folder. A
SentencePiece model ships as ``spiece.model`` + ``tokenizer_config.json`` of transformers' plain
SentencePiece wrapper (``BertGenerationTokenizer``): it encodes with the very SentencePiece model
the data was tokenized with, so ids are the same (tested on every document of the sample corpus),
where a converted "fast" tokenizer may normalise differently.

Names: training/hf/names.py. bloomline masks the padded vocabulary rows out of the softmax, so the export
drops them: ``vocab_size`` is the tokenizer's, and the logits over real tokens equal training's.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Optional

from bloomline.errors import CheckpointError
from bloomline.io import copy_atomic, write_json_atomic
from bloomline.tokenizer import kind_of, tokenizer_files
from data_prep.storage.data_cache import prepared
from data_prep.storage.shards import tokenizer_file
from training.checkpoint.load import load_model
from training.checkpoint.meta import PRECISIONS, check_trained_on
from training.checkpoint.mirror import checkpoint_at
from training.hf.names import hf_name
from training.parallel.layout import EMBEDDING


def hf_config(cfg: Any, tok: dict[str, Any], dtype: str) -> dict[str, Any]:
    """config.json: the fields HF Bloom reads. ``vocab_size`` is the tokenizer's (padding dropped)."""
    return {
        "architectures": ["BloomForCausalLM"],
        "model_type": "bloom",
        "vocab_size": cfg.vocab_size,
        "hidden_size": cfg.hidden_size,
        "n_layer": cfg.num_layers,
        "n_head": cfg.num_heads,
        "layer_norm_epsilon": cfg.layernorm_eps,
        "initializer_range": cfg.init_std,
        "apply_residual_connection_post_layernorm": False,
        "hidden_dropout": 0.0,
        "attention_dropout": 0.0,
        "pretraining_tp": 1,
        "slow_but_exact": False,
        "tie_word_embeddings": True,
        "use_cache": True,
        "bos_token_id": tok["bos_id"],
        "eos_token_id": tok["eos_id"],
        "pad_token_id": tok["pad_id"] if tok["pad_id"] >= 0 else tok["eos_id"],
        "torch_dtype": dtype,
    }


def hf_tokenizer(model_file: str | Path) -> Any:
    """The data's tokenizer file as transformers' tokenizer (see the module docstring)."""
    if kind_of(model_file) == "byte_bpe":
        from transformers import AutoTokenizer

        return AutoTokenizer.from_pretrained(str(Path(model_file).parent), local_files_only=True)
    from transformers import BertGenerationTokenizer

    return BertGenerationTokenizer(
        vocab_file=str(model_file),
        sep_token=None,
        bos_token="<s>",
        eos_token="</s>",
        unk_token="<unk>",
        pad_token="<pad>",
    )


def save_tokenizer(model_file: str | Path, out: str | Path) -> None:
    """The tokenizer as ``AutoTokenizer`` loads it from ``out``: a tokenizer.json and its
    companions copied as they are, a SentencePiece model through its wrapper."""
    if kind_of(model_file) == "byte_bpe":
        for f in tokenizer_files(model_file):
            copy_atomic(f, Path(out) / f.name)
        return
    hf_tokenizer(model_file).save_pretrained(str(out))


def hf_tensors(model: Any) -> dict[str, Any]:
    """``model``'s parameters under HF Bloom's names, the padded vocabulary rows dropped."""
    out = {}
    for name, t in model.state_dict().items():
        if name == EMBEDDING:
            t = t[: model.cfg.vocab_size]  # padding rows: masked in training, dropped here
        out[hf_name(name)] = t.contiguous()
    return out


def hf_model(model: Any, tok: dict[str, Any]) -> Any:
    """``model`` (training.model.bloom.Bloom) as an in-memory ``BloomForCausalLM``, in its dtype: the
    model an export of the same dtype loads (``tok``: the manifest's tokenizer entry)."""
    import torch
    from transformers import BloomConfig, BloomForCausalLM

    tensors = hf_tensors(model)
    dtype = next(iter(tensors.values())).dtype
    conf = hf_config(model.cfg, tok, {torch.float32: "float32", torch.bfloat16: "bfloat16"}[dtype])
    hf = BloomForCausalLM(BloomConfig(**{k: v for k, v in conf.items() if k != "architectures"})).to(dtype)
    missing, unexpected = hf.load_state_dict(tensors, strict=False)
    if unexpected or set(missing) - {"lm_head.weight"}:  # lm_head is tied to the word embeddings
        raise CheckpointError(
            f"the HF model does not take these parameters: missing {missing}, unexpected {unexpected}"
        )
    hf.tie_weights()
    return hf.eval()


def export(ckpt_dir: str | Path, out: str | Path, data_dir: Optional[str | Path] = None, dtype: str = "fp32") -> Path:
    """Write the HF model of ``ckpt_dir`` to ``out``; the tokenizer comes from the data the run
    trained on (``data_dir``, default: the checkpoint's ``data_dir``), checked by its manifest hash."""
    from safetensors.torch import save_file

    from data_prep.storage.shards import load_manifest

    ckpt_dir, out = checkpoint_at(ckpt_dir), Path(out)  # a checkpoint URL: a local copy
    model, meta = load_model(ckpt_dir, PRECISIONS[dtype])
    where = data_dir or meta["data_dir"]  # a URL where the run trained from one
    data = prepared(where)
    manifest = load_manifest(data)
    check_trained_on(
        meta, data, ckpt_dir, "the tokenizer must be the one the model trained with; pass --data with the run's data"
    )
    cfg = model.cfg
    tensors = hf_tensors(model)
    out.mkdir(parents=True, exist_ok=True)
    save_file(tensors, str(out / "model.safetensors"), metadata={"format": "pt"})
    tok = manifest["tokenizer"]
    write_json_atomic(out / "config.json", hf_config(cfg, tok, {"fp32": "float32", "bf16": "bfloat16"}[dtype]))
    save_tokenizer(tokenizer_file(data, manifest), out)
    write_json_atomic(
        out / "bloomline_export.json",
        {
            "checkpoint": str(ckpt_dir.resolve()),
            "step": meta["step"],
            "layout": meta["layout"],
            "dtype": dtype,
            "data_dir": str(where),
        },
    )
    return out


def check_export(out: str | Path) -> dict[str, Any]:
    """What transformers sees in an export: (config, parameter count) — loads offline."""
    from transformers import AutoConfig

    c = AutoConfig.from_pretrained(str(out), local_files_only=True)
    return {
        "model_type": c.model_type,
        "vocab_size": c.vocab_size,
        **json.loads((Path(out) / "bloomline_export.json").read_text()),
    }
