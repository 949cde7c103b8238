"""The evaluation's forward spread over tp·pp ranks, with plain torch.distributed.

Rank 0 (TP rank 0 of the first stage) drives: it runs the tasks, and each call of
:class:`RanksModel` (an :class:`~eval.model.EvalModel`) is a command broadcast to every rank — a
header ``[op, B, T]`` and the call's token tensors — which every other rank waits for in
:func:`serve`. Each stage runs its layers (stage.py); hidden states go from a stage to the next
by send/recv between ranks of the same TP rank, their shape known from the header. The last
stage's TP ranks each hold V/tp logit columns and reduce them to what the call asked for, never
to the logits themselves: log-probabilities of given tokens by a vocabulary-parallel
cross-entropy (as megatron-core's: a max and a sum of exponentials all-reduced over the TP group,
the target's logit from the rank holding its column), greedy tokens by each rank's best column
all-gathered. Its TP rank 0 sends the answer to rank 0.

Why not DeepSpeed's ``PipelineEngine.eval_batch``: it barriers on the global group at every call,
adds each call's outputs into a ``total_loss`` only ``train_batch`` resets, and returns the last
micro-batch's logits only (DeepSpeed 0.19). Point-to-point messages with known shapes need none
of that, and a generation's key-value caches simply stay on the ranks between calls.
"""

from __future__ import annotations

from typing import Any, Optional

import torch
import torch.distributed as dist

from eval.model import eval_layout, scores_of
from eval.parallel.stage import Stage
from training.model.bloom import IGNORE_INDEX, KVCache, run_layers

LOGPROBS, START, STEP, END, STOP = range(5)


class StageRunner:
    """What every rank does with a command: its stage's part of the forward."""

    def __init__(self, stage: Stage, tp: int, pp: int, rank: int, device: torch.device, dtype: torch.dtype):
        self.stage, self.tp, self.pp, self.rank = stage, tp, pp, rank
        self.tp_rank, self.pp_rank = rank % tp, rank // tp  # megatron's order: tp fastest, then (dp = 1) pp
        self.device, self.dtype = device, dtype
        # NCCL moves only GPU tensors; gloo only CPU ones
        self.comm = device if dist.get_backend() == "nccl" else torch.device("cpu")
        self.caches: Optional[dict[str, KVCache]] = None
        self.last_rank = (pp - 1) * tp  # TP rank 0 of the last stage: it answers rank 0

    def broadcast(self, t: torch.Tensor) -> torch.Tensor:
        t = t.to(self.comm)
        dist.broadcast(t, src=0)
        return t.to(self.device)

    @torch.no_grad()
    def run(
        self, op: int, ids: torch.Tensor, seg: torch.Tensor, targets: Optional[torch.Tensor]
    ) -> Optional[torch.Tensor]:
        """This stage's part of command ``op``; the answer on the rank that gets it (rank 0), else None."""
        if op == START:
            self.caches = {n: KVCache() for n, _ in self.stage.layers if n.startswith("blocks.")}
        B, T = ids.shape
        if self.stage.first:
            x = (ids, seg)
        else:
            h = torch.empty(B, T, self.stage.cfg.hidden_size, dtype=self.dtype, device=self.comm)
            dist.recv(h, src=self.rank - self.tp)
            x = (h.to(self.device), seg)
        x = run_layers(self.stage.layers, x, self.caches if op in (START, STEP) else None)
        answer = None
        if not self.stage.last:
            dist.send(x[0].contiguous().to(self.comm), dst=self.rank + self.tp)
        else:
            logits = self.stage.projection(x, project=True)  # [B, T, V/tp]: this rank's columns
            answer = self.scores(logits, targets) if op == LOGPROBS else self.greedy(logits[:, -1])
            if self.pp > 1 and self.tp_rank == 0:
                dist.send(answer.to(self.comm), dst=0)
        if self.rank == 0 and self.pp > 1:
            answer = torch.empty(
                (2, B, T) if op == LOGPROBS else (B,),
                dtype=torch.float32 if op == LOGPROBS else torch.long,
                device=self.comm,
            )
            dist.recv(answer, src=self.last_rank)
        return answer if self.rank == 0 else None

    def scores(self, logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        """[2, B, T] float32: the log-probability of each target and 1 where it is the greedy
        choice (:meth:`EvalModel.token_scores`), from this rank's columns: the largest logit and
        the sum of exponentials all-reduced over the TP group, and the target's logit from the
        rank that holds its column."""
        if self.tp == 1:
            logp, top = scores_of(logits, targets)
            return torch.stack([logp, top.float()])
        from megatron.core import parallel_state as ps

        group = ps.get_tensor_model_parallel_group()
        local = logits.float()
        keep = targets != IGNORE_INDEX
        first, width = self.stage.projection.first_row, local.shape[-1]
        mine = keep & (targets >= first) & (targets < first + width)
        at = torch.where(mine, targets - first, 0)
        big = self.all_reduce(local.max(-1).values, dist.ReduceOp.MAX, group)
        total = self.all_reduce((local - big[..., None]).exp().sum(-1), dist.ReduceOp.SUM, group)
        target = self.all_reduce(
            torch.where(mine, local.gather(-1, at[..., None])[..., 0], 0.0), dist.ReduceOp.SUM, group
        )
        logp = torch.where(keep, target - big - total.log(), 0.0)
        return torch.stack([logp, (keep & (target >= big)).float()])

    def all_reduce(self, t: torch.Tensor, op: Any, group: Any) -> torch.Tensor:
        t = t.to(self.comm)
        dist.all_reduce(t, op=op, group=group)
        return t.to(self.device)

    def greedy(self, last: torch.Tensor) -> torch.Tensor:
        """The best real token of each row from this rank's columns [B, V/tp] (padding columns are
        masked far below any real logit): the lowest id among equal bests, as ``argmax``."""
        best = last.float().argmax(-1)
        if self.tp == 1:
            return best
        from megatron.core import parallel_state as ps

        value = last.float().gather(-1, best[:, None])[:, 0]
        ids = best + self.stage.projection.first_row
        group = ps.get_tensor_model_parallel_group()
        values = [torch.empty_like(value, device=self.comm) for _ in range(self.tp)]
        tokens = [torch.empty_like(ids, device=self.comm) for _ in range(self.tp)]
        dist.all_gather(values, value.to(self.comm), group=group)
        dist.all_gather(tokens, ids.to(self.comm), group=group)
        winner = torch.stack(values).argmax(0)  # the first rank that holds the best: the lowest id
        return torch.stack(tokens).gather(0, winner[None])[0].to(self.device)

    def serve(self) -> None:
        """Every rank but 0: run commands until rank 0 says stop."""
        while True:
            head = self.broadcast(torch.zeros(3, dtype=torch.long)).tolist()
            op, B, T = head
            if op == STOP:
                return
            if op == END:
                self.caches = None
                continue
            ids, seg, targets = self.payload(op, B, T)
            self.run(op, ids, seg, targets)

    def payload(self, op: int, B: int, T: int) -> tuple[torch.Tensor, torch.Tensor, Optional[torch.Tensor]]:
        if op == STEP:
            ids = self.broadcast(torch.zeros(B, 1, dtype=torch.long))
            return ids, torch.ones_like(ids), None
        n = 3 if op == LOGPROBS else 2
        packed = self.broadcast(torch.zeros(n, B, T, dtype=torch.long))
        return packed[0], packed[1], packed[2] if op == LOGPROBS else None


class RanksModel:
    """:class:`~eval.model.EvalModel` on rank 0: each call a command to every rank."""

    def __init__(self, runner: StageRunner):
        self.runner = runner
        self.cfg = runner.stage.cfg
        self.device = runner.device
        self.layout = eval_layout(runner.tp, runner.pp, runner.device)

    def _command(self, op: int, *tensors: torch.Tensor) -> Optional[torch.Tensor]:
        """Broadcast command ``op`` and its token tensors ([B, T]; a step's [B] tokens as [B, 1]),
        then run this rank's part of it."""
        r = self.runner
        ids = tensors[0].reshape(len(tensors[0]), -1) if tensors else torch.zeros(0, 1, dtype=torch.long)
        r.broadcast(torch.tensor([op, *ids.shape], dtype=torch.long))
        if op in (END, STOP):
            return None
        if op == STEP:
            ids = r.broadcast(ids.long())
            seg, targets = torch.ones_like(ids), None
        else:
            packed = r.broadcast(torch.stack([t.long() for t in tensors]))
            ids, seg, targets = packed[0], packed[1], packed[2] if op == LOGPROBS else None
        return r.run(op, ids, seg, targets).cpu()

    def token_scores(
        self, input_ids: torch.Tensor, segment_ids: torch.Tensor, targets: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        both = self._command(LOGPROBS, input_ids, segment_ids, targets)
        return both[0], both[1] > 0

    def token_logprobs(self, input_ids: torch.Tensor, segment_ids: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        return self.token_scores(input_ids, segment_ids, targets)[0]

    def start(self, input_ids: torch.Tensor, segment_ids: torch.Tensor) -> torch.Tensor:
        return self._command(START, input_ids, segment_ids)

    def step(self, tokens: torch.Tensor) -> torch.Tensor:
        return self._command(STEP, tokens)

    def end(self) -> None:
        self._command(END)
        self.runner.caches = None

    def close(self) -> None:
        """Tell every other rank to stop serving."""
        self._command(STOP)
