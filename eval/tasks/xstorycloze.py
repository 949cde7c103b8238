"""``xstorycloze``: pick the right ending of a four-sentence story (XStoryCloze, BLOOM's rank
evaluation), scored by lm-eval's ``xstorycloze_<lang>`` over ``DATA/<lang>.jsonl``. Chance 1/2."""

from eval.tasks.lm_eval_local import LocalLmEvalTask, lm_eval_languages


class XStoryCloze(LocalLmEvalTask):
    name = "xstorycloze"
    family = "xstorycloze"
    subtasks = lm_eval_languages("xstorycloze", "xstorycloze_")
    fields = (
        "input_sentence_1",
        "input_sentence_2",
        "input_sentence_3",
        "input_sentence_4",
        "sentence_quiz1",
        "sentence_quiz2",
        "answer_right_ending",
    )
    text_fields = ("input_sentence_1", "input_sentence_2", "input_sentence_3", "input_sentence_4")
    chance = {"acc": 1 / 2, "acc_norm": 1 / 2, "acc_bytes": 1 / 2}
