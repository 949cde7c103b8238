"""The manifest pass: the ledger of every document, the shard list, split totals and the
language blend, written last and atomically as ``DIR/manifest.json`` (contract 1,
``data_prep/FORMAT.md``): its presence means the data is complete."""

from __future__ import annotations

from typing import Any

import bloomline
from bloomline import languages
from bloomline.config import to_dict
from bloomline.errors import DataError
from bloomline.io import write_json_atomic
from bloomline.secrets import mask_text, mask_tree
from bloomline.tokenizer import open_tokenizer
from data_prep.config import PrepareConfig
from data_prep.passes.alpha import alpha_weights
from data_prep.reports.kept_scores import kept_stats
from data_prep.steps.document import OUTCOMES, Ledger
from data_prep.steps.step import merge_reports
from data_prep.storage.droplog import DROPPED_DIR, SCORES_DIR, check_dropped
from data_prep.storage.shards import FORMAT_VERSION
from data_prep.storage.workdir import Paths


def blend_weights(cfg: PrepareConfig, train_tokens: dict[str, int]) -> dict[str, float]:
    present = {k: v for k, v in train_tokens.items() if v > 0}
    if cfg.blend.weights:
        w = {languages.resolve(k): v for k, v in cfg.blend.weights.items()}
        missing = sorted(k for k in w if k not in present and w[k] > 0)
        if missing:
            raise DataError(f"blend.weights names {missing}, which have no training data")
        z = sum(w.get(k, 0.0) for k in present)
        if z <= 0:
            raise DataError("blend.weights gives no weight to any language with training data")
        return {k: round(w.get(k, 0.0) / z, 8) for k in sorted(present)}
    return {k: round(v, 8) for k, v in alpha_weights(present, cfg.blend.alpha).items()}


def write_manifest(
    cfg: PrepareConfig,
    paths: Paths,
    plan_: dict[str, Any],
    chunk_summaries: list[dict],
    dedup: dict[str, Any],
    tok: dict[str, Any],
    part_results: list[dict],
) -> dict[str, Any]:
    """The manifest of a finished run, from every pass's record, checked (the ledger balances, the
    drop log matches it) and written atomically, last."""
    for folder in (DROPPED_DIR, SCORES_DIR):  # written by every task; read here whole
        paths.tree(paths.out / folder)
    ledger = merged_ledger(chunk_summaries, dedup, part_results)
    shards = sorted((s for r in part_results for s in r["shards"]), key=lambda s: s["path"])
    train_tokens, split_totals = shard_totals(shards)
    langs = language_entries(ledger, part_results, train_tokens)
    bad = check_dropped(paths.out, langs)
    if bad:
        raise RuntimeError("the drop log does not match the ledger (a bug): " + "; ".join(bad[:5]))
    manifest = {
        "format_version": FORMAT_VERSION,
        "created_by": f"bloomline {bloomline.__version__}",
        "fingerprint": plan_["fingerprint"],
        "tokenizer": tokenizer_entry(paths, tok),
        "buckets": list(cfg.pack.buckets),
        "seq_len": cfg.pack.seq_len,
        "shards": shards,
        "splits": split_totals,
        "blend": blend_weights(cfg, train_tokens),
        "languages": langs,
        "totals": {**ledger.totals(), "input_records": sum(e["docs_in"] for e in langs.values())},
        "stages": stage_reports(cfg, paths, chunk_summaries, dedup, part_results),
        "inputs": sorted({m["path"] for c in plan_["chunks"] for m in (c.get("members") or [c])}),
        "seed": cfg.seed,
        "dropped": {
            "path": DROPPED_DIR,
            "rows": sum(n for e in langs.values() for k in OUTCOMES for n in e[k].values()),
            "text_chars": cfg.dropped_text_chars,
        },
        "scores": {"path": SCORES_DIR},
        "config": mask_tree(to_dict(cfg)),  # no URL password or token in a file people share
        "recipe": {"file": cfg.recipe, "summary": mask_text(cfg.summary())},
    }
    if plan_.get("decontaminate"):  # what the data was cleaned against: each task file's sha256, items, n-grams
        manifest["decontaminated_against"] = plan_["decontaminate"]
    manifest["config"].pop("dask", None)
    manifest["config"].pop("recipe", None)  # beside it, under "recipe"
    manifest["config"].pop("strict", None)  # in the fingerprint: a finished run had no bad record to stop at
    write_json_atomic(paths.manifest, manifest)
    return manifest


def merged_ledger(chunk_summaries: list[dict], dedup: dict[str, Any], part_results: list[dict]) -> Ledger:
    """Every stage's ledger in one, which must balance: each document read is kept or dropped once."""
    ledger = Ledger()
    for s in chunk_summaries:
        ledger.merge(s["ledger"])
    for lang, kinds in dedup["duplicates"].items():
        for kind, n in kinds.items():
            ledger.drop(lang, "duplicates", kind, n=n)
    for r in part_results:
        ledger.merge(r["ledger"])
    bad = ledger.check_balance()
    if bad:
        raise RuntimeError("ledger does not balance (a bug): " + "; ".join(bad))
    return ledger


def shard_totals(shards: list[dict[str, Any]]) -> tuple[dict[str, int], dict[str, dict[str, Any]]]:
    """(training tokens per language, per split: rows, tokens, bucket tokens and padding share)."""
    train_tokens: dict[str, int] = {}
    split_totals: dict[str, dict[str, Any]] = {}
    for s in shards:
        if s["split"] == "train":
            train_tokens[s["lang"]] = train_tokens.get(s["lang"], 0) + s["tokens"]
        t = split_totals.setdefault(s["split"], {"rows": 0, "tokens": 0, "bucket_tokens": 0})
        t["rows"] += s["rows"]
        t["tokens"] += s["tokens"]
        t["bucket_tokens"] += s["rows"] * s["bucket"]
    for t in split_totals.values():
        t["padding_fraction"] = round(1 - t["tokens"] / t["bucket_tokens"], 6) if t["bucket_tokens"] else 0.0
    return train_tokens, split_totals


def language_entries(ledger: Ledger, part_results: list[dict], train_tokens: dict[str, int]) -> dict[str, Any]:
    """The manifest's ``languages``: each language's ledger with its validation documents,
    training tokens and name."""
    langs = ledger.to_dict()
    for r in part_results:
        e = langs[r["lang"]]
        e["valid_docs"] = e.get("valid_docs", 0) + r["docs"]["valid"]
    for lang, e in langs.items():
        e.setdefault("valid_docs", 0)
        e["train_tokens"] = train_tokens.get(lang, 0)
        if languages.resolve(lang) is not None:
            e["name"] = languages.get(lang).name
    return langs


def stage_reports(
    cfg: PrepareConfig, paths: Paths, chunk_summaries: list[dict], dedup: dict[str, Any], part_results: list[dict]
) -> dict[str, Any]:
    """The manifest's ``stages``: each step's report summed over chunks and parts, with the kept
    documents' score statistics."""
    steps = merge_reports(s["steps"] for s in chunk_summaries)
    if cfg.filters.enabled:
        steps.setdefault("quality", {})["kept_scores"] = kept_stats(paths.out, cfg.filters)
    steps["dedup"] = {
        "duplicates": merge_reports(dedup["duplicates"].values()),
        "docs_out": sum(dedup["kept_docs"].values()),
    }
    steps["pii"] = merge_reports(r["pii"] for r in part_results)
    return steps


def tokenizer_entry(paths: Paths, tok: dict[str, Any]) -> dict[str, Any]:
    """The manifest's ``tokenizer``: the file, its kind, size and sha256, the ids of its special
    tokens as the tokenizer itself gives them, and what a grown one extends."""
    t = open_tokenizer(paths.tokenizer, tok["sha256"])
    entry = {
        "path": paths.tokenizer.relative_to(paths.out).as_posix(),
        "kind": t.kind,
        "vocab_size": tok["vocab_size"],
        "sha256": tok["sha256"],
        "trained": tok["trained"],
        **{f"{role}_id": int(i) for role, i in t.ids.items()},
    }
    if tok.get("trained"):
        entry["sample_weights"] = tok["sample_weights"]
    if tok.get("extends"):
        entry["extends"] = tok["extends"]
    return entry
