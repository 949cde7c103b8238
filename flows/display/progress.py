"""Progress as the user sees it: the bars of prepare's passes in the terminal (:class:`ProgressBars`),
and training's progress while the ranks run (:class:`TrainProgress`): step/steps, loss, tokens/s
and ETA, in the terminal (the flow's log) and as a Prefect progress artifact.

The ranks already append one JSON line per step to ``RUN_DIR/metrics.jsonl`` (training/loop/trainer.py);
the flow reads what is new every few seconds while it waits on the job (``run_job``'s ``poll``),
so the report costs the ranks nothing and needs no channel of its own.
"""

from __future__ import annotations

import time
from datetime import timedelta
from pathlib import Path
from typing import Any, Callable

from bloomline.secrets import mask_text
from bloomline.terminal import rich_escape
from training.loop.metrics_log import read_metrics

# Steps of the ETA's moving window: long enough to smooth the dynamic batches' varying
# bucket sizes, short enough to follow a change of speed (a resumed run, a busy machine).
ETA_WINDOW = 20


class TrainProgress:
    """Tails ``metrics.jsonl`` from a byte offset and reports at most every ``every_s`` seconds
    (and at the last step). Reporting never fails the run: a report that cannot be made is dropped."""

    def __init__(
        self,
        metrics: Path,
        steps: int,
        log: Callable[[str], None],
        every_s: float = 10.0,
        artifact_key: str | None = "train-progress",
    ):
        self.metrics, self.steps, self.log, self.every_s = Path(metrics), steps, log, every_s
        self.offset = self.metrics.stat().st_size if self.metrics.exists() else 0  # this attempt's lines only
        self.recent: list[dict[str, Any]] = []
        # the first report is due at once, whatever the monotonic clock reads (it starts near 0 at boot)
        self.last_report = float("-inf")
        self.reported_step = -1
        self.artifact_key = artifact_key
        self.artifact_id: Any = None
        self.weights: dict[str, float] | None = None  # the mixture's last reported weights

    def read_new(self) -> list[dict[str, Any]]:
        out, self.offset = read_metrics(self.metrics, self.offset)
        return out

    def eta_seconds(self) -> float | None:
        """Seconds left at the recent pace: mean wall time per step over the window."""
        if len(self.recent) < 2:
            return None
        a, b = self.recent[0], self.recent[-1]
        if "time" not in a or "time" not in b or b["step"] <= a["step"]:
            return None
        per_step = (b["time"] - a["time"]) / (b["step"] - a["step"])
        return max(self.steps - b["step"], 0) * per_step

    def line(self) -> str:
        r = self.recent[-1]
        loss = "-" if r.get("loss") is None else f"{r['loss']:.4f}"
        tps = [x["tokens_per_s"] for x in self.recent[-5:] if x.get("tokens_per_s")]
        rate = f"{sum(tps) / len(tps):,.0f} tokens/s" if tps else "- tokens/s"
        eta = self.eta_seconds()
        eta_s = "-" if eta is None else str(timedelta(seconds=round(eta)))
        return (
            f"step {r['step']}/{self.steps} ({100 * r['step'] / self.steps:.0f}%) | loss {loss} | {rate} | ETA {eta_s}"
        )

    def __call__(self) -> None:
        try:
            new = self.read_new()
            if not new:
                return
            for r in new:
                if r.get("mixture_weights"):
                    self._mixture_artifact(r)
            self.recent = (self.recent + new)[-ETA_WINDOW:]
            step = self.recent[-1]["step"]
            now = time.monotonic()
            if step == self.reported_step or (now - self.last_report < self.every_s and step < self.steps):
                return
            self.last_report, self.reported_step = now, step
            text = self.line()
            self.log(text)
            self._artifact(100.0 * step / self.steps, text)
        except Exception:  # noqa: BLE001 - a progress report must never stop training
            return

    def _mixture_artifact(self, r: dict[str, Any]) -> None:
        """One table artifact per change of the online mixture's weights (key ``mixture-weights``:
        Prefect keeps each change as a version), with the step and its cause."""
        if self.artifact_key is None:
            return
        try:
            from prefect.artifacts import create_table_artifact

            before = self.weights or {}
            cause = r.get("mixture_cause") or {}
            rows = [
                {"lang": lang, "weight": round(w, 6), "before": round(before[lang], 6) if lang in before else None}
                for lang, w in sorted(r["mixture_weights"].items(), key=lambda kv: -kv[1])
            ]
            what = cause.get("signal", "") + (f", checkpoint {cause['checkpoint']}" if "checkpoint" in cause else "")
            create_table_artifact(
                rows,
                key="mixture-weights",
                description=mask_text(f"step {r['step']}: {cause.get('rule', '?')} ({what})"),
            )
            self.weights = dict(r["mixture_weights"])
        except Exception:  # noqa: BLE001 - no Prefect run context (a plain call), or the server is gone
            return

    def _artifact(self, percent: float, text: str) -> None:
        if self.artifact_key is None:
            return
        try:
            from prefect.artifacts import create_progress_artifact, update_progress_artifact

            if self.artifact_id is None:
                self.artifact_id = create_progress_artifact(
                    progress=percent, key=self.artifact_key, description=mask_text(text)
                )
            else:
                update_progress_artifact(self.artifact_id, progress=percent, description=mask_text(text))
        except Exception:  # noqa: BLE001 - no Prefect run context (a plain call), or the server is gone
            self.artifact_key = None


class ProgressBars:
    """Progress bars per pass of prepare (data_prep/pipeline.py PASSES): bytes and bytes/s for those
    counted in bytes, a count of their unit for the others."""

    def __init__(self, console: Any) -> None:
        from rich.progress import (
            BarColumn,
            DownloadColumn,
            MofNCompleteColumn,
            Progress,
            ProgressColumn,
            TextColumn,
            TimeElapsedColumn,
            TransferSpeedColumn,
        )

        class ByUnit(ProgressColumn):
            """Bytes for passes counted in bytes, "done/total unit" for the others."""

            def __init__(self, in_bytes: ProgressColumn, other: ProgressColumn) -> None:
                super().__init__()
                self.in_bytes, self.other = in_bytes, other

            def render(self, task):  # noqa: ANN001, ANN201 (rich's signature)
                return (self.in_bytes if task.fields.get("unit") == "B" else self.other).render(task)

        self._p = Progress(
            TextColumn("[bold]{task.description:<14}"),
            BarColumn(),
            ByUnit(DownloadColumn(), MofNCompleteColumn()),
            ByUnit(TransferSpeedColumn(), TextColumn("{task.fields[unit]}")),
            TimeElapsedColumn(),
            console=console,
            transient=False,
        )
        self._tasks: dict[str, int] = {}
        self._p.start()

    def start(self, name: str, total: int, unit: str) -> None:
        self._tasks[name] = self._p.add_task(name, total=max(total, 1), unit=unit)

    def advance(self, name: str, n: int = 1) -> None:
        self._p.advance(self._tasks[name], n)

    def finish(self, name: str, message: str) -> None:
        tid = self._tasks.get(name)
        if tid is not None:
            self._p.update(tid, completed=self._p.tasks[tid].total)
        self._p.console.print(f"[green]✓[/] {name}: {rich_escape(message)}")

    def stop(self) -> None:
        self._p.stop()
