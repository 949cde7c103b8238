"""lm-evaluation-harness (PyPI ``lm-eval``) on an export, fully offline: a local task over one
language's validation documents, scored with ``loglikelihood_rolling`` into ``bits_per_byte``.

The documents are the language's validation segments decoded from the shards (so the text is the
one bloomline evaluates, after normalisation and PII redaction). The numbers differ from
bloomline's ``bpb`` by definition, not by error (tested to match a reimplementation of lm-eval's
rule): lm-eval predicts a document's first token too, conditioned on the end-of-text token ``</s>``
(passed as its ``prefix_token_id``: by default it would take the tokenizer's ``<s>``, which
training never saw; a document always follows a ``</s>`` in packed samples), and divides by all
of the document's bytes, while bloomline does not predict a document's first
token (there is no context for it in a packed sample) and leaves its bytes out; and lm-eval
re-tokenizes the decoded text, which at a piece cut inside a word or a character is not always
the tokens bloomline scored.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from data_prep.storage.shards import tokenizer_file
from training.data.shard_reader import ShardIndex


def validation_documents(data_dir: str | Path, lang: str) -> list[str]:
    """The language's validation text as bloomline evaluates it: one entry per document segment of
    the validation samples (a document longer than the largest bucket was cut into pieces by the
    packer, and the shards keep no link between them), decoded without its </s>."""
    from bloomline.tokenizer import open_tokenizer
    from eval.evaluate import language_samples

    index = ShardIndex(data_dir, "valid")
    tok = open_tokenizer(tokenizer_file(index.data_dir, index.manifest))
    eos = tok.eos_id
    docs = []
    for _, refs in language_samples(index, lang, None):
        for sid, row in refs:
            toks, offsets = index.fetch(sid, row)
            bounds = [*offsets.tolist(), len(toks)]
            for a, b in zip(bounds, bounds[1:]):
                text = tok.decode([int(x) for x in toks[a:b] if x != eos])
                if text.strip():
                    docs.append(text)
    return docs


def write_task(data_dir: str | Path, lang: str, folder: str | Path) -> str:
    """A local lm-eval task (``dataset_path: json``) over ``lang``'s validation documents; its name."""
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    name = "bloomline_bpb_" + lang.lower().replace("-", "_")
    docs = folder / f"{name}.jsonl"
    docs.write_text(
        "".join(json.dumps({"text": d}, ensure_ascii=False) + "\n" for d in validation_documents(data_dir, lang))
    )
    (folder / f"{name}.yaml").write_text(
        f"task: {name}\ndataset_path: json\ndataset_kwargs:\n  data_files:\n    test: {json.dumps(str(docs))}\n"
        'test_split: test\noutput_type: loglikelihood_rolling\ndoc_to_text: ""\ndoc_to_target: "{{text}}"\n'
        "metric_list:\n  - metric: bits_per_byte\n    aggregation: bits_per_byte\n    higher_is_better: false\n"
    )
    return name


def lm_eval_bits_per_byte(
    hf_dir: str | Path, data_dir: str | Path, lang: str, work: str | Path, max_length: int
) -> dict[str, Any]:
    """Run lm-eval offline on the export ``hf_dir``; ``max_length`` is passed explicitly because
    BLOOM's config has no ``n_positions`` for lm-eval to read. The process's environment is as it
    was afterwards (the offline switches hold for this call only)."""
    from eval.tasks.lm_eval_local import export_lm_args, run_lm_eval

    name = write_task(data_dir, lang, work)
    # prefix_token_id: the first token is conditioned on </s>, what precedes every document in
    # training (packed samples); lm-eval would take the tokenizer's BOS, <s>, which training never saw
    eos = json.loads((Path(hf_dir) / "config.json").read_text())["eos_token_id"]
    res = run_lm_eval("hf", [name], work, None, model_args=export_lm_args(hf_dir, max_length, eos))
    return {
        "task": name,
        "bits_per_byte": float(res["results"][name]["bits_per_byte,none"]),
        "documents": len((Path(work) / f"{name}.jsonl").read_text().splitlines()),  # as write_task wrote them
    }
