"""``xnli``: entailment, neutral or contradiction between a premise and a hypothesis (XNLI,
BLOOM's rank evaluation), scored by lm-eval's ``xnli_<lang>`` (its prompt words per language)
over ``DATA/<lang>.jsonl``. Chance 1/3."""

from eval.tasks.lm_eval_local import LocalLmEvalTask, lm_eval_languages


class XNli(LocalLmEvalTask):
    name = "xnli"
    family = "xnli"
    subtasks = lm_eval_languages("xnli", "xnli_")
    fields = ("premise", "hypothesis", "label")
    text_fields = ("premise", "hypothesis")
    chance = {"acc": 1 / 3, "acc_norm": 1 / 3, "acc_bytes": 1 / 3}
