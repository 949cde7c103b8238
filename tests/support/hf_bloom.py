"""An existing Hugging Face BLOOM, made here (nothing is downloaded): a byte-level BPE
``tokenizer.json`` trained with ``tokenizers`` on the sample corpus, in BLOOM's pipeline and with
BLOOM's tokenizer_config.json, and a tiny random ``BloomForCausalLM`` saved as transformers saves
one (``config.json`` and safetensors, sharded with an index when asked)."""

from __future__ import annotations

import json
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
SAMPLE = REPO / "data_prep" / "sample_corpus"


def sample_lines(files: list[Path]) -> list[str]:
    return [json.loads(line)["text"] + "\n" for f in files for line in f.read_text(encoding="utf-8").splitlines()]


def bloom_tokenizer(folder: Path, vocab_size: int = 1200, files: list[Path] | None = None) -> Path:
    """A BLOOM-style tokenizer folder (tokenizer.json + BLOOM's tokenizer_config.json) trained on
    ``files`` (default: every sample-corpus file); the folder."""
    from data_prep.passes.byte_bpe import SPECIAL_CONFIG, train_bpe

    files = files or sorted(SAMPLE.rglob("*.jsonl"))
    folder.mkdir(parents=True, exist_ok=True)
    text = folder / "sample.txt"
    text.write_text("".join(sample_lines(files)), encoding="utf-8")
    tok = train_bpe([text], vocab_size, placeholders=False)
    text.unlink()
    (folder / "tokenizer.json").write_text(tok.to_str(), encoding="utf-8")
    conf = {
        "tokenizer_class": "BloomTokenizerFast",
        "padding_side": "left",
        "add_prefix_space": False,
        **SPECIAL_CONFIG,
    }
    (folder / "tokenizer_config.json").write_text(json.dumps(conf, indent=2))
    return folder


def tiny_bloom(
    folder: Path,
    vocab_size: int,
    hidden: int = 64,
    layers: int = 4,
    heads: int = 4,
    seed: int = 0,
    shard_size: str | None = None,
) -> Path:
    """A random BloomForCausalLM (fp32, BLOOM's init std and LayerNorms perturbed so they matter)
    saved in ``folder`` with safetensors; ``shard_size`` (e.g. "100KB") writes it sharded with an
    index, as the larger BLOOMs are. The folder."""
    import torch
    from transformers import BloomConfig, BloomForCausalLM

    torch.manual_seed(seed)
    conf = BloomConfig(
        vocab_size=vocab_size,
        hidden_size=hidden,
        n_layer=layers,
        n_head=heads,
        layer_norm_epsilon=1e-5,
        initializer_range=0.02,
        bos_token_id=1,
        eos_token_id=2,
        pad_token_id=3,
    )
    model = BloomForCausalLM(conf).eval()
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "layernorm" in name or "ln_f" in name:
                p.add_(0.1 * torch.randn_like(p))  # not the 1/0 init, so a mixed-up norm shows
            elif name.endswith("bias"):
                p.normal_(0.0, 0.02)
    model.save_pretrained(
        str(folder), safe_serialization=True, **({"max_shard_size": shard_size} if shard_size else {})
    )
    return folder
