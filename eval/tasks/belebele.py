"""``belebele``: reading comprehension, one of four answers to a question on a FLORES passage
(Belebele), scored by lm-eval's ``belebele_<flores code>`` over ``DATA/<lang>.jsonl`` (bloomline's
language codes; the FLORES code is looked up here). Chance 1/4."""

from eval.tasks.lm_eval_local import LocalLmEvalTask

FLORES = {
    "bm": "bam_Latn",
    "ig": "ibo_Latn",
    "lg": "lug_Latn",
    "ln": "lin_Latn",
    "nso": "nso_Latn",
    "ny": "nya_Latn",
    "rw": "kin_Latn",
    "sn": "sna_Latn",
    "st": "sot_Latn",
    "sw": "swh_Latn",
    "tn": "tsn_Latn",
    "ts": "tso_Latn",
    "wo": "wol_Latn",
    "xh": "xho_Latn",
    "yo": "yor_Latn",
    "zu": "zul_Latn",
    "as": "asm_Beng",
    "bn": "ben_Beng",
    "gu": "guj_Gujr",
    "hi": "hin_Deva",
    "kn": "kan_Knda",
    "ml": "mal_Mlym",
    "mr": "mar_Deva",
    "ne": "npi_Deva",
    "or": "ory_Orya",
    "pa": "pan_Guru",
    "ta": "tam_Taml",
    "te": "tel_Telu",
    "ur": "urd_Arab",
    "ar": "arb_Arab",
    "eu": "eus_Latn",
    "ca": "cat_Latn",
    "zh-Hans": "zho_Hans",
    "zh-Hant": "zho_Hant",
    "en": "eng_Latn",
    "fr": "fra_Latn",
    "id": "ind_Latn",
    "pt": "por_Latn",
    "es": "spa_Latn",
    "vi": "vie_Latn",
}
"""bloomline language → Belebele's FLORES-200 code (the BLOOM languages Belebele has)."""


class Belebele(LocalLmEvalTask):
    name = "belebele"
    family = "belebele"
    subtasks = {l: f"belebele_{c}" for l, c in FLORES.items()}
    fields = (
        "flores_passage",
        "question",
        "mc_answer1",
        "mc_answer2",
        "mc_answer3",
        "mc_answer4",
        "correct_answer_num",
    )
    text_fields = ("flores_passage", "question")
    chance = {"acc": 1 / 4, "acc_norm": 1 / 4, "acc_bytes": 1 / 4}
