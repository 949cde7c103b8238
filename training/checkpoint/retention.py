"""What a run keeps of its checkpoints: keep-last-K pruning, and the hold by which another process
(the evaluation watcher) asks pruning to keep what it still needs (``checkpoints/hold.json``,
``checkpoints/pruned.jsonl``; training/CHECKPOINT.md). A mixin of
:class:`~training.checkpoint.run_dir.RunDir`, whose folder methods (``checkpoints``,
``latest_step``, ``complete_steps``, ``step_number``) it uses."""

from __future__ import annotations

import json
import shutil
from typing import Any, Callable, Iterable, Optional

from bloomline.errors import CheckpointError
from bloomline.io import read_contract_json, write_json_atomic


class Retention:
    """Pruning and the hold, on a run folder (mixed into RunDir)."""

    hold_file = property(lambda self: self.checkpoints / "hold.json")
    pruned_log = property(lambda self: self.checkpoints / "pruned.jsonl")

    def hold(self, pid: int, released: Iterable[int], max_deferred: int, busy: Optional[int] = None) -> None:
        """While process ``pid`` lives, :meth:`prune` keeps every complete checkpoint not in
        ``released``, up to ``max_deferred`` of them, and the one it is ``busy`` with in any case
        (``checkpoints/hold.json``, CHECKPOINT.md)."""
        write_json_atomic(
            self.hold_file,
            {"pid": pid, "released": sorted(set(released)), "max_deferred": max_deferred, "busy": busy},
            durable=False,
        )

    def holder(self) -> Optional[dict[str, Any]]:
        """The hold, when its process is alive (a hold left by a dead process holds nothing)."""
        import os

        try:
            h = read_contract_json(self.hold_file, CheckpointError, "")
            os.kill(int(h["pid"]), 0)
            return h
        except (CheckpointError, OSError, ValueError, KeyError, TypeError):
            return None

    def pruned(self) -> list[dict[str, Any]]:
        """``{"step", "reason"}`` of every held checkpoint :meth:`prune` deleted, in order."""
        if not self.pruned_log.is_file():
            return []
        return [json.loads(line) for line in self.pruned_log.read_text().splitlines() if line.strip()]

    def prune(self, keep: int, upto: Optional[int] = None, writer: bool = True) -> list[int]:
        """Delete the checkpoints older than the newest ``keep`` up to step ``upto`` (default:
        ``latest``), and — for the run's ``writer`` only, the trainer or the flow once its ranks
        have ended — every other folder that is not one of them: incomplete ones (a killed save)
        and any above ``upto`` (written by a job that died before moving ``latest``; a run resumed
        from an earlier step has replaced that future). Another process (the evaluation watcher)
        passes ``writer=False``: to it, a folder above ``latest`` may be a save in progress, and
        deleting one took the files from under the ranks writing it. While a :meth:`hold` is
        alive, the complete checkpoints it has not released are kept too, up to its
        ``max_deferred``; older held ones are deleted, each with its reason appended to
        ``checkpoints/pruned.jsonl``. Returns the steps deleted."""
        upto = self.latest_step() if upto is None else upto
        if upto is None:
            return []
        complete = [s for s in self.complete_steps() if s <= upto]
        kept = set(complete[-keep:]) | {upto}
        hold = self.holder()
        released, max_deferred = (set(hold["released"]), hold["max_deferred"]) if hold else (set(), 0)
        deferred = [s for s in complete[:-keep] if hold and s not in released]
        late = deferred[: len(deferred) - max_deferred] if len(deferred) > max_deferred else []
        if hold and hold.get("busy") is not None:  # being read now: never pulled from under its reader
            kept.add(hold["busy"])
            late = [s for s in late if s != hold["busy"]]
        if late:
            with open(
                self.pruned_log, "a", encoding="utf-8"
            ) as log:  # one short line per write: appends do not interleave
                for s in late:
                    log.write(
                        json.dumps(
                            {
                                "step": s,
                                "reason": f"deleted by checkpoint.keep={keep} before its evaluation "
                                f"ran: more than evaluation.max_deferred={max_deferred} checkpoints were "
                                f"waiting for one",
                            }
                        )
                        + "\n"
                    )
        kept |= set(deferred) - set(late)
        return self._delete(lambda step: step not in kept and (writer or step in complete))

    def discard_unpublished(self) -> list[int]:
        """Delete the step folders ``latest`` does not stand for: incomplete ones (a killed save)
        and any above it (saved by a job killed before it moved ``latest``: the run resumed from
        ``latest`` replaces that future, and nothing may read it meanwhile). For the run's writer
        before its ranks start; the steps deleted."""
        upto = self.latest_step() or 0
        complete = set(self.complete_steps())
        return self._delete(lambda step: step > upto or step not in complete)

    def _delete(self, condemned: Callable[[int], bool]) -> list[int]:
        deleted = []
        for p in self.checkpoints.iterdir() if self.checkpoints.is_dir() else []:
            step = self.step_number(p.name)
            if step is not None and condemned(step):
                shutil.rmtree(p, ignore_errors=True)
                deleted.append(step)
        return sorted(deleted)
