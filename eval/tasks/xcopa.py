"""``xcopa``: the more plausible cause or effect of a premise (XCOPA, BLOOM's rank evaluation),
scored by lm-eval's ``xcopa_<lang>`` (its connector words per language) over ``DATA/<lang>.jsonl``.
Chance 1/2."""

from eval.tasks.lm_eval_local import LocalLmEvalTask, lm_eval_languages


class XCopa(LocalLmEvalTask):
    name = "xcopa"
    family = "xcopa"
    subtasks = lm_eval_languages("xcopa", "xcopa_")
    fields = ("premise", "choice1", "choice2", "question", "label")
    text_fields = ("premise", "choice1", "choice2")
    chance = {"acc": 1 / 2, "acc_norm": 1 / 2, "acc_bytes": 1 / 2}
