"""``flores``: translation to and from English of local sentence pairs (FLORES-101/200 style),
greedy, scored by chrF++ (sacrebleu's ``CHRF(word_order=2)``, corpus level).

``DATA/<lang>.jsonl`` holds one pair per record: ``{"en": "<English sentence>", "<lang>": "<the
same sentence in lang>"}`` (bloomline's codes as keys, e.g. ``"zh-Hans"``); ``en.jsonl`` is not
read. For each pair and direction the model continues the prompt ``"<Source name>:
<source>\\n<Target name>:"`` greedily until a newline, </s> or ``2 × source tokens + 8`` new
tokens (at most 128), and the text before the newline, stripped, is the translation. Rows per
language: ``chrf_from_en`` (English → the language) and ``chrf_to_en``, in chrF++ points
(0–100), over ``n`` sentences (no standard error: chrF++ is a corpus statistic). A pair without
both texts is a malformed record: the language is skipped with ``file:line``. ``limit``: the first
sentences (default 50).
"""

from __future__ import annotations

from pathlib import Path

from bloomline import languages
from bloomline.errors import DataError
from bloomline.task_spec import task_records
from eval.generate import generate
from eval.tasks.base import Context, Row, Task, skipped, with_means

SENTENCES = 50
"""Pairs per language unless the task's ``limit`` says otherwise."""
MAX_NEW = 128


def pairs(path: Path, lang: str, limit: int) -> list[tuple[str, str]]:
    """(English, ``lang``) pairs of a data file; a DataError naming ``path:line`` for a bad one."""
    out = []
    for no, rec in task_records(path):
        if len(out) >= limit:
            break
        bad = [k for k in ("en", lang) if not isinstance(rec.get(k), str) or not rec[k].strip()]
        if bad:
            raise DataError(
                f"{path}:{no}: the record needs the texts {' and '.join(repr(k) for k in bad)} "
                f'(flores records are {{"en": ..., "{lang}": ...}})'
            )
        out.append((rec["en"].strip(), rec[lang].strip()))
    return out


def translations(ctx: Context, texts: list[str], src: str, tgt: str) -> list[str]:
    """The model's greedy translations of ``texts`` from ``src`` to ``tgt`` (module docstring),
    decoded together (eval/generate.py) and each cut at its own budget, so each is what it would
    be alone."""
    prompts = [ctx.tokenizer.encode(f"{languages.get(src).name}: {t}\n{languages.get(tgt).name}:") for t in texts]
    budgets = [min(MAX_NEW, 2 * len(ctx.tokenizer.encode(t)) + 8) for t in texts]
    outs = generate(
        ctx.model, prompts, max(budgets, default=0), ctx.eos_id, stop=lambda ids: "\n" in ctx.tokenizer.decode(ids)
    )
    return [ctx.tokenizer.decode(o[:n]).split("\n")[0].strip() for o, n in zip(outs, budgets)]


class Flores(Task):
    name = "flores"
    needs_data = True

    def run(self, ctx: Context) -> list[Row]:
        from sacrebleu.metrics import CHRF

        chrf = CHRF(word_order=2)  # chrF++
        data = Path(ctx.spec.data)
        files = {p.name[: -len(".jsonl")]: p for p in sorted(data.glob("*.jsonl")) if p.name != "en.jsonl"}
        rows: list[Row] = []
        for lang in sorted(
            {*files, *(l for l in ctx.index.languages if languages.get(l).kind == "natural" and l != "en")}
        ):
            if ctx.spec.langs is not None and lang not in ctx.spec.langs:
                continue
            if lang not in files:
                rows.append(skipped(lang, f"no {data / (lang + '.jsonl')}"))
                continue
            if languages.resolve(lang) != lang:
                rows.append(skipped(lang, f"'{lang}' is not one of bloomline's language codes"))
                continue
            try:
                got = pairs(files[lang], lang, ctx.spec.limit or SENTENCES)
            except DataError as e:
                rows.append(skipped(lang, f"malformed record: {e}"))
                continue
            if not got:
                rows.append(skipped(lang, f"{files[lang]} holds no pairs"))
                continue
            for metric, src, tgt, refs in (
                ("chrf_from_en", "en", lang, [t for _, t in got]),
                ("chrf_to_en", lang, "en", [e for e, _ in got]),
            ):
                hyps = translations(ctx, [e if src == "en" else t for e, t in got], src, tgt)
                rows.append(Row(lang, metric, float(chrf.corpus_score(hyps, [refs]).score), None, len(got)))
            ctx.progress(f"flores {lang}: chrF++ {rows[-2].value:.1f} from English, {rows[-1].value:.1f} to English")
        return with_means(rows)
