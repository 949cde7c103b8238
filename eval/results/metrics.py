"""Per-language evaluation metrics and their aggregates (definitions in eval/RESULTS.md).

For a language: ``loss`` = Σ NLL / tokens (nats per predicted token), ``ppl`` = exp(loss), and
**bits per byte** ``bpb`` = Σ NLL of the tokens that stand for text / (ln 2 · Σ UTF-8 bytes of
that text). Bits per byte does not depend on the tokenizer, so languages and models compare (The
Pile, Gao et al. 2020, §3; lm-evaluation-harness's ``bits_per_byte``).

Aggregates, per BLOOM group (``niger-congo``, ``indic``, ``other``, ``code``) and overall, come
two ways: token-weighted (the sums of the group's languages, as if one language) and the
unweighted mean of its languages' values (every language counts once).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from bloomline import languages
from eval.results.rows import is_language

LN2 = math.log(2.0)
GROUPS = languages.GROUPS


@dataclass
class LangTotals:
    """Sums over one language's evaluated tokens."""

    nll: float = 0.0
    """Σ NLL (nats) of every predicted token, </s> included (as the training loss)."""
    tokens: int = 0
    """Predicted tokens."""
    text_nll: float = 0.0
    """Σ NLL (nats) of the predicted tokens that stand for text (bytes > 0)."""
    bytes: int = 0
    """UTF-8 bytes of the text the predicted tokens stand for."""
    docs: int = 0
    """Documents: the </s> tokens evaluated (every document ends with one, data_prep/FORMAT.md)."""

    def add(self, other: "LangTotals") -> None:
        self.nll += other.nll
        self.tokens += other.tokens
        self.text_nll += other.text_nll
        self.bytes += other.bytes
        self.docs += other.docs

    @property
    def loss(self) -> float:
        return self.nll / self.tokens if self.tokens else math.nan

    @property
    def ppl(self) -> float:
        return math.exp(self.loss) if self.tokens and self.loss < 700 else math.inf if self.tokens else math.nan

    @property
    def bpb(self) -> float:
        return self.text_nll / (LN2 * self.bytes) if self.bytes else math.nan


def group_of(lang: str) -> str:
    return languages.get(lang).group


def metric_rows(per_lang: dict[str, LangTotals], tokens_seen: dict[str, int]) -> list[dict]:
    """One row per language, then per group and overall, token-weighted and as language means.

    Columns: scope (``language``/``group``/``overall``), lang (the language; for an aggregate its
    group, or ``all``), family (the language's BLOOM group; an aggregate's own name), weighting
    (``tokens`` or ``mean``; ``tokens`` for a language), loss, ppl, bpb, tokens, bytes, docs,
    tokens_seen."""
    rows = []
    for lang, t in sorted(per_lang.items()):
        rows.append(
            {
                "scope": "language",
                "lang": lang,
                "family": group_of(lang),
                "weighting": "tokens",
                "loss": t.loss,
                "ppl": t.ppl,
                "bpb": t.bpb,
                "tokens": t.tokens,
                "bytes": t.bytes,
                "docs": t.docs,
                "tokens_seen": int(tokens_seen.get(lang, 0)),
            }
        )
    sets = [("group", g, [l for l in per_lang if group_of(l) == g]) for g in GROUPS] + [
        ("overall", "all", list(per_lang))
    ]
    for scope, name, langs in sets:
        if not langs:
            continue
        total = LangTotals()
        for l in langs:
            total.add(per_lang[l])
        base = {
            "scope": scope,
            "lang": name,
            "family": name,
            "tokens": total.tokens,
            "bytes": total.bytes,
            "docs": total.docs,
            "tokens_seen": int(sum(tokens_seen.get(l, 0) for l in langs)),
        }
        rows.append({**base, "weighting": "tokens", "loss": total.loss, "ppl": total.ppl, "bpb": total.bpb})
        mean = lambda xs: sum(xs) / len(xs)  # noqa: E731
        rows.append(
            {
                **base,
                "weighting": "mean",
                "loss": mean([per_lang[l].loss for l in langs]),
                "ppl": mean([per_lang[l].ppl for l in langs]),
                "bpb": mean([per_lang[l].bpb for l in langs]),
            }
        )
    return rows


def regressions(
    rows: list[dict[str, Any]], before: dict[str, dict[str, Any]], threshold: float
) -> list[dict[str, Any]]:
    """Languages whose bits per byte rose by more than ``threshold`` (relative) since ``before``."""
    out = []
    for r in rows:
        old = before.get(r["lang"])
        if not is_language(r) or old is None or not (old["bpb"] > 0 and math.isfinite(r["bpb"])):
            continue
        change = (r["bpb"] - old["bpb"]) / old["bpb"]
        if change > threshold:
            out.append(
                {
                    "lang": r["lang"],
                    "step": r["step"],
                    "previous_step": old["step"],
                    "bpb": r["bpb"],
                    "previous_bpb": old["bpb"],
                    "change": change,
                }
            )
    return out


def change_from(langs: list[dict[str, Any]], base_step: int) -> tuple[int, list[dict[str, Any]]]:
    """Each language's bits per byte at the latest step against ``base_step`` (for a run started
    from imported weights: step 0, the model before any update): the latest step and, per language
    evaluated at both, ``{lang, base_bpb, bpb, change}`` (relative; negative: it gained, positive:
    it forgot), most forgotten first. ``langs``: validation rows of languages."""
    at = {(r["lang"], r["step"]): r["bpb"] for r in langs}
    last = max((r["step"] for r in langs), default=base_step)
    out = [
        {"lang": lang, "base_bpb": base, "bpb": at[lang, last], "change": (at[lang, last] - base) / base}
        for (lang, step), base in sorted(at.items())
        if step == base_step and (lang, last) in at and base > 0 and math.isfinite(at[lang, last])
    ]
    return last, sorted(out, key=lambda c: -c["change"])
