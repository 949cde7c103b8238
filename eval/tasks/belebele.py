"""``belebele``: reading comprehension, one of four answers to a question on a FLORES passage
(Belebele), scored by lm-eval's ``belebele_<flores code>`` over ``DATA/<lang>.jsonl`` (bloomline's
language codes; a FLORES-200 code such as ``tur_Latn`` is read as one, bloomline/languages.py), in
every language lm-eval has it for (122). Chance 1/4."""

from eval.tasks.lm_eval_local import LocalLmEvalTask, lm_eval_languages


class Belebele(LocalLmEvalTask):
    name = "belebele"
    family = "belebele"
    subtasks = lm_eval_languages("belebele", "belebele_")
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
