"""The evaluation-task contract (eval/tasks/): what a task needs, what it returns.

A task is one class with a ``name`` and :meth:`Task.run`. It gets a :class:`Context` — the
checkpoint's model as an :class:`eval.model.EvalModel` (token log-probabilities and greedy
decoding, wherever it runs), the data's tokenizer and validation split, the evaluation settings,
its own :class:`~training.config.TaskSpec` (its ``data`` folder, ``langs``, ``limit``) — and returns :class:`Row` s: per language, one row
per metric (``value``, ``stderr`` where it has one, ``n`` the items or tokens it is over), and
a ``skipped`` row, with the reason in ``note``, for a language it cannot run. Rows of the group
and overall means are added by :func:`with_means` (each language counts once). The evaluation
process (eval/evaluate.py) runs every task of ``tasks`` after the validation task, writes their
rows into the checkpoint's results file (contract 3) and nothing else changes:
adding a task is a new file here and a line in the registry (eval/tasks/__init__.py).

A task never runs in the training loop: evaluation runs in its own process beside training
(flows/stages/watch.py) or after it.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any, Callable, ClassVar, Optional

from bloomline import languages


@dataclass
class Context:
    model: Any
    """eval.model.EvalModel: the checkpoint in the evaluation's precision, in this process (LocalModel)
    or over tp·pp ranks (lm-eval's families run on either: eval/tasks/lm_eval_local.py ``lm_of``)."""
    tokenizer: Any
    """The data's tokenizer (bloomline/tokenizer.py ``Tokenizer``: ids as the model was trained on them)."""
    index: Any
    """training.data.shard_reader.ShardIndex of the data's validation split."""
    token_bytes: Any
    """UTF-8 bytes each token id stands for (bloomline/tokenizer.py ``Tokenizer.token_bytes``)."""
    tokenizer_file: Any
    """Path of the data's tokenizer file (what an export ships, training/hf/to_hf.py)."""
    eos_id: int
    settings: Any
    """training.config.EvalConfig."""
    spec: Any
    """training.config.TaskSpec of this task (name, data, langs, limit)."""
    tokens_seen: dict[str, int] = field(default_factory=dict)
    """Training tokens of each language the checkpoint had consumed."""
    progress: Callable[[str], None] = lambda msg: None

    def languages(self, available: list[str]) -> list[str]:
        """``available`` narrowed to the spec's ``langs``, in order."""
        want = self.spec.langs
        return [l for l in available if want is None or l in want]


@dataclass
class Row:
    lang: str
    metric: str
    value: Optional[float]
    stderr: Optional[float] = None
    n: Optional[int] = None
    note: Optional[str] = None
    scope: str = "language"
    weighting: str = "tokens"

    def to_dict(self, task: str) -> dict[str, Any]:
        family = languages.get(self.lang).group if self.scope == "language" else self.lang
        return {
            "task": task,
            "scope": self.scope,
            "lang": self.lang,
            "family": family,
            "weighting": self.weighting,
            "metric": self.metric,
            "value": self.value,
            "stderr": self.stderr,
            "n": self.n,
            "note": self.note,
        }


def skipped(lang: str, why: str) -> Row:
    """The row that says a language was not evaluated by a task, and why."""
    return Row(lang, "skipped", None, note=why)


class Task:
    name: ClassVar[str]
    chance: ClassVar[Optional[dict[str, float]]] = None
    """Each metric's chance level (the signal report's floor), where the task has one."""

    def run(self, ctx: Context) -> list[Row]:
        raise NotImplementedError


def proportion(k: int, n: int) -> tuple[float, float]:
    """(k/n, its standard error sqrt(p(1-p)/(n-1)), as lm-eval reports for accuracy)."""
    p = k / n
    return p, math.sqrt(p * (1 - p) / (n - 1)) if n > 1 else math.nan


def with_means(rows: list[Row]) -> list[Row]:
    """``rows`` plus, per metric, the mean over each BLOOM group's languages and over all of them
    (scope ``group``/``overall``, weighting ``mean``; every language counts once)."""
    from eval.results.metrics import GROUPS

    out = list(rows)
    metrics = sorted({r.metric for r in rows if r.scope == "language" and r.metric != "skipped"})
    for m in metrics:
        vals = [r for r in rows if r.scope == "language" and r.metric == m and r.value is not None]
        sets = [("group", g, [r for r in vals if languages.get(r.lang).group == g]) for g in GROUPS] + [
            ("overall", "all", vals)
        ]
        for scope, name, rs in sets:
            if rs:
                out.append(Row(name, m, sum(r.value for r in rs) / len(rs), n=len(rs), scope=scope, weighting="mean"))
    return out
