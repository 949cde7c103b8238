"""The model as the evaluation tasks see it (:class:`EvalModel`): the log-probability of given
tokens, and greedy next tokens with a key-value cache, whether the checkpoint runs in this
process (:class:`LocalModel`, on the CPU or the accelerator) or spread over tp·pp ranks
(eval/parallel/). Tasks ask for what they score, never for logits: at BLOOM's 250,880 tokens a
batch's full-vocabulary logits are gigabytes, and a tensor-parallel model would have to gather
them over its ranks first.
"""

from __future__ import annotations

from typing import Any, Optional, Protocol

import torch
import torch.nn.functional as F

from bloomline.errors import ConfigError
from training.model.bloom import IGNORE_INDEX, Bloom, KVCache, run_layers


def resolve_device(device: str) -> torch.device:
    """``auto``: the accelerator when one is present, else the CPU; ``cuda`` without one is refused."""
    if device == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if device == "cuda" and not torch.cuda.is_available():
        raise ConfigError("device", "cuda, but torch sees no GPU on this machine (use device=auto or device=cpu)")
    return torch.device(device)


def eval_layout(tp: int, pp: int, device: torch.device | str) -> str:
    """The layout an evaluation ran in, as the results' ``eval_layout`` column names it
    (``tp=1 pp=2 device=cpu``: both sizes always, in the ``layout`` column's style)."""
    return f"tp={tp} pp={pp} device={torch.device(device).type}"


class EvalModel(Protocol):
    """What every task calls. Tensors go in on the CPU; what comes back is on the CPU."""

    cfg: Any
    """training.config.ModelConfig of the checkpoint."""
    device: torch.device
    """Where the model computes (the ranks' device, for a parallel one)."""
    layout: str
    """Where it runs (:func:`eval_layout`)."""

    def token_scores(
        self, input_ids: torch.Tensor, segment_ids: torch.Tensor, targets: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """log p(targets[b, t] | the tokens of its document up to t), float32 [B, T], 0 where a
        target is IGNORE_INDEX; and whether each target is the greedy choice there (its logit is
        the largest), bool [B, T]. input_ids, segment_ids, targets: [B, T]."""
        ...

    def token_logprobs(self, input_ids: torch.Tensor, segment_ids: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        """The log-probabilities of :meth:`token_scores`."""
        ...

    def start(self, input_ids: torch.Tensor, segment_ids: torch.Tensor) -> torch.Tensor:
        """Open a generation: run the (left-padded) prompts [B, T] into a fresh key-value cache;
        the greedy next token of each, [B]."""
        ...

    def step(self, tokens: torch.Tensor) -> torch.Tensor:
        """Append one token per prompt [B] to the open generation; the next greedy tokens [B]."""
        ...

    def end(self) -> None:
        """Drop the open generation's cache."""
        ...


def scores_of(logits: torch.Tensor, targets: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """:meth:`EvalModel.token_scores` from whole logits [B, T, V] (padded vocabulary columns
    masked): the fp32 cross-entropy the training loss computes, negated."""
    keep = targets != IGNORE_INDEX
    safe = torch.where(keep, targets, 0)
    logits = logits.float()
    nll = F.cross_entropy(logits.flatten(0, 1), safe.flatten(), reduction="none").view(targets.shape)
    top = logits.gather(-1, safe[..., None])[..., 0] >= logits.max(-1).values
    return torch.where(keep, -nll, 0.0), top & keep


class LocalModel:
    """The checkpoint's whole single-device ``Bloom`` on one device (:class:`EvalModel`)."""

    def __init__(self, model: Bloom, device: torch.device):
        self.bloom = model.to(device).eval()
        self.cfg = model.cfg
        self.device = device
        self.layout = eval_layout(1, 1, device)
        self._caches: Optional[dict[str, KVCache]] = None

    @torch.no_grad()
    def token_scores(
        self, input_ids: torch.Tensor, segment_ids: torch.Tensor, targets: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        d = self.device
        targets = targets.to(d)
        hidden, _ = run_layers(self.bloom.layers(), (input_ids.to(d), segment_ids.to(d)))
        # Only the scored positions go through the output layer: a task scores an ending's 16 tokens
        # of 48, and the vocabulary's logits cost more than the layers of a small model (bloom-tiny's
        # continuation task: 2.1x faster on CPU, same rows) and hold gigabytes at BLOOM's 250,880 tokens.
        keep = targets != IGNORE_INDEX
        logp, top = scores_of(self.bloom.embedding((hidden[keep][None], None), project=True), targets[keep][None])
        out_logp = torch.zeros(targets.shape, dtype=torch.float32, device=d)
        out_top = torch.zeros(targets.shape, dtype=torch.bool, device=d)
        out_logp[keep], out_top[keep] = logp[0], top[0]
        return out_logp.cpu(), out_top.cpu()

    def token_logprobs(self, input_ids: torch.Tensor, segment_ids: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        return self.token_scores(input_ids, segment_ids, targets)[0]

    def _next(self, input_ids: torch.Tensor, segment_ids: torch.Tensor) -> torch.Tensor:
        d = self.device
        logits = self.bloom(input_ids.to(d), segment_ids.to(d), self._caches)
        return logits[:, -1, : self.cfg.vocab_size].argmax(-1).cpu()

    @torch.no_grad()
    def start(self, input_ids: torch.Tensor, segment_ids: torch.Tensor) -> torch.Tensor:
        self._caches = {f"blocks.{i}": KVCache() for i in range(self.cfg.num_layers)}
        return self._next(input_ids, segment_ids)

    @torch.no_grad()
    def step(self, tokens: torch.Tensor) -> torch.Tensor:
        ids = tokens[:, None]
        return self._next(ids, torch.ones_like(ids))

    def end(self) -> None:
        self._caches = None


class TransformersModel:
    """A causal language model that transformers loads and bloomline does not build (GPT-2, Llama,
    Qwen…: a published folder of another architecture), in this process (:class:`EvalModel`).

    Each document of a packed sample runs alone (their own positions from 0, no attention across
    them: what ``segment_ids`` means), padded on the right into one batch; the scores are those of
    :func:`scores_of` over the tokenizer's ``vocab`` columns. Greedy generation keeps transformers'
    own key-value cache, the left padding masked and positions counted from each prompt's start."""

    def __init__(self, model: Any, cfg: Any, device: torch.device):
        self.hf = model.to(device).eval()
        self.cfg = cfg
        self.device = device
        self.layout = eval_layout(1, 1, device)
        self._past: Any = None
        self._mask: Optional[torch.Tensor] = None

    @torch.no_grad()
    def token_scores(
        self, input_ids: torch.Tensor, segment_ids: torch.Tensor, targets: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        logp = torch.zeros(targets.shape, dtype=torch.float32)
        top = torch.zeros(targets.shape, dtype=torch.bool)
        docs = [
            (b, (segment_ids[b] == s).nonzero()[:, 0])
            for b in range(len(input_ids))
            for s in segment_ids[b].unique()
            if s > 0
        ]
        width = max((len(at) for _, at in docs), default=0)
        if not docs:
            return logp, top
        ids = torch.zeros(len(docs), width, dtype=torch.long)
        mask = torch.zeros(len(docs), width, dtype=torch.long)
        want = torch.full((len(docs), width), IGNORE_INDEX, dtype=torch.long)
        for i, (b, at) in enumerate(docs):
            ids[i, : len(at)], mask[i, : len(at)], want[i, : len(at)] = input_ids[b, at], 1, targets[b, at]
        d = self.device
        out = self.hf(input_ids=ids.to(d), attention_mask=mask.to(d), use_cache=False).logits[
            ..., : self.cfg.vocab_size
        ]
        lp, tp = scores_of(out, want.to(d))
        for i, (b, at) in enumerate(docs):
            logp[b, at], top[b, at] = lp[i, : len(at)].cpu(), tp[i, : len(at)].cpu()
        return logp, top

    def token_logprobs(self, input_ids: torch.Tensor, segment_ids: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        return self.token_scores(input_ids, segment_ids, targets)[0]

    def _next(self, ids: torch.Tensor) -> torch.Tensor:
        assert self._mask is not None
        pos = (self._mask.cumsum(-1) - 1).clamp(min=0)[:, -ids.shape[1] :]
        out = self.hf(
            input_ids=ids.to(self.device),
            attention_mask=self._mask,
            position_ids=pos,
            past_key_values=self._past,
            use_cache=True,
        )
        self._past = out.past_key_values
        return out.logits[:, -1, : self.cfg.vocab_size].argmax(-1).cpu()

    @torch.no_grad()
    def start(self, input_ids: torch.Tensor, segment_ids: torch.Tensor) -> torch.Tensor:
        self._past, self._mask = None, (segment_ids > 0).long().to(self.device)
        return self._next(input_ids)

    @torch.no_grad()
    def step(self, tokens: torch.Tensor) -> torch.Tensor:
        assert self._mask is not None
        self._mask = torch.cat([self._mask, torch.ones_like(self._mask[:, :1])], dim=1)
        return self._next(tokens[:, None])

    def end(self) -> None:
        self._past, self._mask = None, None
