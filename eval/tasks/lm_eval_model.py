"""lm-eval's ``HFLM`` scoring through an :class:`~eval.model.EvalModel` (the parallel evaluator's
ranks), so its families run on a model no process holds whole.

Everything up to the token ids is HFLM's own: tokenizing, the context/continuation split,
the ``prefix_token_id`` of an empty context, the rolling windows; and everything after, the
task's metrics, is lm-eval's. Only :meth:`EvalModelLM._loglikelihood_tokens` is ours: where
HFLM gathers the whole vocabulary's logits of a batch to take the log-softmax at the
continuation's tokens (at 250,880 tokens, gigabytes per batch), it asks the model for the
log-probability of exactly those tokens and whether each is the greedy choice
(``EvalModel.token_scores``), computed where the logits live. The window rule is HFLM's: the
last ``max_length + 1`` tokens of context + continuation, the last one predicted, not input.

The ``HFLM`` is built around :class:`Facade`, which stands where HFLM keeps a transformers model:
it answers HFLM's questions about the model (its config and device) and computes nothing.
Generation requests (``generate_until``) are refused: none of our families asks for one.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

from training.model.bloom import IGNORE_INDEX


class Facade(nn.Module):
    """What HFLM reads off the model it wraps: ``config`` (transformers' BloomConfig of the
    checkpoint) and ``device``; ``tie_weights`` has nothing to tie."""

    def __init__(self, config: Any):
        super().__init__()
        self.config = config

    @property
    def device(self) -> torch.device:
        return torch.device("cpu")  # HFLM builds its request tensors here; the EvalModel moves them

    def tie_weights(self) -> None:
        pass

    def forward(self, *args: Any, **kwargs: Any) -> Any:
        raise NotImplementedError("the parallel evaluator's logits stay on its ranks; ask EvalModel.token_scores")


def evalmodel_lm(model: Any, config: Any, tokenizer: Any, max_length: int, eos_id: int, batch_size: int) -> Any:
    """HFLM over ``model`` (an EvalModel), with the settings of eval/tasks/lm_eval_local.py ``in_memory_lm``."""
    from lm_eval.models.huggingface import HFLM

    class EvalModelLM(HFLM):
        def _loglikelihood_tokens(
            self, requests: list[tuple[Any, list[int], list[int]]], disable_tqdm: bool = False, override_bs: Any = None
        ) -> list[tuple[float, bool]]:
            answers: list[tuple[float, bool]] = [(0.0, False)] * len(requests)
            # longest first, as HFLM orders them: batches of like lengths pad least
            order = sorted(range(len(requests)), key=lambda i: -len(requests[i][1]) - len(requests[i][2]))
            for at in range(0, len(order), batch_size):
                chunk = order[at : at + batch_size]
                windows = [(requests[i][1] + requests[i][2])[-(self.max_length + 1) :] for i in chunk]
                width = max(len(w) - 1 for w in windows)
                ids = torch.zeros(len(chunk), width, dtype=torch.long)
                seg = torch.zeros_like(ids)
                targets = torch.full_like(ids, IGNORE_INDEX)
                for b, (i, w) in enumerate(zip(chunk, windows)):
                    n = len(w) - 1
                    k = min(len(requests[i][2]), n)
                    ids[b, :n] = torch.tensor(w[:-1])
                    seg[b, :n] = 1
                    targets[b, n - k : n] = torch.tensor(w[-k:])
                logp, top = model.token_scores(ids, seg, targets)
                keep = targets != IGNORE_INDEX
                for b, i in enumerate(chunk):
                    answer = (float(logp[b][keep[b]].sum()), bool(top[b][keep[b]].all()))
                    answers[i] = answer
                    if requests[i][0] is not None:
                        self.cache_hook.add_partial("loglikelihood", requests[i][0], answer)
            return answers

        def generate_until(self, requests: Any, disable_tqdm: bool = False) -> Any:
            raise NotImplementedError("generation tasks do not run on the parallel evaluator's lm-eval model")

    return EvalModelLM(
        pretrained=Facade(config),
        tokenizer=tokenizer,
        backend="causal",
        max_length=max_length,
        batch_size=batch_size,
        prefix_token_id=eos_id,
        device="cpu",
    )
