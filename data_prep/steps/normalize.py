"""Normalize step: Unicode NFC and removal of control characters.

NFC (not NFKC) because NFKC rewrites meaningful characters (ligatures, full-width forms in
Chinese text, superscripts in code). Control characters (Unicode category Cc) are removed
except tab and newline, which carry structure in code and prose; carriage returns become
newlines. Text that cannot be encoded as UTF-8 (lone surrogates from a ``\\ud800`` escape) is an
error ``invalid_unicode``; text left empty is an error ``empty_after_normalize``.
"""

from __future__ import annotations

import re
import unicodedata

from data_prep.steps.document import Document
from data_prep.steps.step import PipelineStep

# Cc = C0 and C1 controls and DEL; keep \t and \n.
_CONTROL = re.compile(r"[\x00-\x08\x0b\x0c\x0e-\x1f\x7f-\x9f]")


def normalize_text(text: str) -> str:
    text = text.replace("\r\n", "\n").replace("\r", "\n")
    text = _CONTROL.sub("", text)
    return unicodedata.normalize("NFC", text)


class Normalizer(PipelineStep):
    name = "normalize"

    def process(self, doc: Document) -> Document | None:
        try:
            doc.text.encode("utf-8")
        except UnicodeEncodeError:
            self.drop(doc, "errors", "invalid_unicode")
            return None
        text = normalize_text(doc.text)
        if text != doc.text:
            self.stats["changed"] += 1
        if not text.strip():
            self.drop(doc, "errors", "empty_after_normalize")
            return None
        doc.text = text
        return doc
