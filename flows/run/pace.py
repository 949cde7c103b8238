"""Hold the evaluation process to a share of one core while training runs.

Neither a nice level nor Linux's idle scheduling class keeps a CPU evaluation from slowing training
on a machine whose cores training fills: measured on a 2-core machine beside bloom-tiny's training
(one rank, two threads), a busy loop in the idle class cost training 24% of its tokens/s, a
one-thread matmul loop in the idle class 38%, and the evaluator itself slowed each training step
2.5× for as long as it ran (the rank's threads wake into a core the other process holds, and the
two share caches and memory bandwidth). What training loses grows with the CPU time the evaluator
uses, so that is what the pacer caps: a token bucket refilled at ``share`` CPU seconds per wall
second (at most ``burst_s`` banked, so a wait for a checkpoint does not buy a long burst later),
drained by the process's CPU time; when it runs dry the process sleeps until it refills. Work the
cap defers is done once training has ended (``active()`` false), at full speed.

:func:`install` calls :meth:`Pacer.pace` before every ``torch.nn.Module`` forward in the process
(torch's global forward pre-hook), every parameter registered (models being built) and every
import: every task's model calls pass through there, bloomline's own model and transformers'
alike, without any task knowing, and so does the first evaluation's seconds of importing; the
watcher also calls it after each checkpoint, which settles the CPU spent elsewhere (writing
results, the dashboard).
"""

from __future__ import annotations

import sys
import threading
import time
from typing import Any, Callable


class Pacer:
    """CPU seconds used ≤ ``share`` × wall seconds (+ ``burst_s``) while ``active()``."""

    def __init__(
        self,
        share: float,
        active: Callable[[], bool],
        burst_s: float = 1.0,
        check_s: float = 0.01,
        active_every_s: float = 1.0,
        slice_s: float = 1.0,
        clock: Callable[[], float] = time.monotonic,
        cpu: Callable[[], float] = time.process_time,
        sleep: Callable[[float], None] = time.sleep,
        on_end: Callable[[], None] = lambda: None,
    ):
        if share <= 0:
            raise ValueError(f"share must be > 0, got {share}")
        self.share, self.active, self.burst_s = share, active, burst_s
        self.check_s, self.active_every_s, self.slice_s = check_s, active_every_s, slice_s
        self.clock, self.cpu, self.sleep = clock, cpu, sleep
        self.on_end = on_end
        """Called once, in the pacing thread, when ``active()`` is first found false: an evaluation
        under way may then take the cores training has left (torch's thread count is the caller's
        thread's), not only the next one."""
        self.wall, self.used = clock(), cpu()
        self.bucket = burst_s
        self.is_active, self.asked = True, float("-inf")
        self.slept = 0.0
        """Seconds slept so far (reported by the watcher)."""
        self.thread = threading.get_ident()
        """The thread that paces (the one that made the pacer): the bucket is not shared between threads."""

    def pace(self) -> None:
        if threading.get_ident() != self.thread:  # the evaluation's own thread: Prefect's workers also import
            return
        now = self.clock()
        if now - self.wall < self.check_s:  # called per module: look at the clocks 100 times a second at most
            return
        if now - self.asked >= self.active_every_s:
            self._ask(now)
        used = self.cpu()
        self.bucket = min(self.burst_s, self.bucket + self.share * (now - self.wall)) - (used - self.used)
        self.wall, self.used = now, used
        if not self.is_active:
            self.bucket = self.burst_s
            return
        if self.bucket < 0:
            # in slices: a debt of seconds (an import, the dashboard) stops being paid the moment
            # training ends, so the drain runs at full speed
            wait = -self.bucket / self.share
            while wait > 0 and self.is_active:
                nap = min(wait, self.slice_s)
                self.sleep(nap)
                self.slept += nap
                wait -= nap
                self._ask(self.clock())
            self.wall, self.used, self.bucket = self.clock(), self.cpu(), 0.0

    def _ask(self, now: float) -> None:
        was, self.is_active, self.asked = self.is_active, self.active(), now
        if was and not self.is_active:
            self.on_end()


class _PaceOnImport:
    """A meta-path finder that finds nothing: it only paces before each import is looked up."""

    def __init__(self, pacer: Pacer):
        self.pacer = pacer

    def find_spec(self, name: str, path: Any, target: Any = None) -> None:
        self.pacer.pace()
        return None


def install(pacer: Pacer) -> Callable[[], None]:
    """Call ``pacer.pace()`` before every module forward, every parameter a module registers (a
    model being built) and every import in this process; returns what removes the hooks."""
    import torch

    finder = _PaceOnImport(pacer)
    sys.meta_path.insert(0, finder)  # the first evaluation imports lm-eval, transformers, plotly: seconds of CPU
    hooks = [
        torch.nn.modules.module.register_module_forward_pre_hook(lambda module, args: pacer.pace()),
        torch.nn.modules.module.register_module_parameter_registration_hook(lambda module, name, param: pacer.pace()),
    ]

    def remove() -> None:
        sys.meta_path.remove(finder)
        for h in hooks:
            h.remove()

    return remove
