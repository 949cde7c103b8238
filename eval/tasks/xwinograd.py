"""``xwinograd``: which of two options fills a sentence's blank (XWinograd, BLOOM's rank
evaluation), scored by lm-eval's ``xwinograd_<lang>`` (one context per option, the same
continuation) over ``DATA/<lang>.jsonl``. Chance 1/2."""

from eval.tasks.lm_eval_local import LocalLmEvalTask, lm_eval_languages


class XWinograd(LocalLmEvalTask):
    name = "xwinograd"
    family = "xwinograd"
    subtasks = lm_eval_languages("xwinograd", "xwinograd_")
    fields = ("sentence", "option1", "option2", "answer")
    text_fields = ("sentence",)
    chance = {"acc": 1 / 2, "acc_norm": 1 / 2, "acc_bytes": 1 / 2}
