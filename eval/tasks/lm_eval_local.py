"""Tasks scored by lm-eval's own definitions over local files (xstorycloze, xcopa, xnli,
xwinograd, belebele: one small file each, naming its lm-eval tasks and record fields).

A task's ``data`` folder holds ``<lang>.jsonl`` per language (bloomline's codes, data_prep/
FORMAT.md), records in the schema of the dataset lm-eval's task of that name reads. For each
language the task writes a one-file lm-eval task that *includes lm-eval's own YAML* (prompt,
choices, target, any ``!function``) and only points it at the local file (``dataset_path: json``,
``dataset_kwargs.data_files``, the file as its test split) and lists the metrics ``acc``,
``acc_norm`` (per character) and ``acc_bytes`` (per UTF-8 byte; lm-eval #3278: per character is
unfair across scripts). No hub is reached: every machine of ours is offline.

The model lm-eval scores is the checkpoint's, as an in-memory ``BloomForCausalLM``
(training/hf/to_hf.py ``hf_model``) with the exported tokenizer, wrapped in lm-eval's ``HFLM``: the
same model class, tokenizer, request batching and metric code as ``lm_eval --model hf`` on
``bloomline export``'s folder, so the numbers are lm-eval's, item for item (tests/eval/tasks/
test_lm_eval_local.py runs both). Languages: those of the model's data and of the folder's files
(narrowed by ``langs``); one without a file, or one lm-eval has no prompt for, is skipped with the
reason; a malformed record skips its language with the file:line in the reason, and everything
else still runs.
"""

from __future__ import annotations

import json
import os
import tempfile
from contextlib import contextmanager
from functools import lru_cache
from pathlib import Path
from typing import Any, ClassVar, Iterator, Optional

from bloomline.errors import DataError
from bloomline.task_spec import task_records
from eval.tasks.base import Context, Row, Task, skipped, with_means

METRICS = ("acc", "acc_norm", "acc_bytes")
BATCH = 16
"""Requests lm-eval scores in one forward pass (the same in the run on an export, for equal numbers)."""


@lru_cache(maxsize=None)
def lm_eval_yaml(family: str, task: str) -> Path:
    """lm-eval's own YAML of ``task`` (the file under ``lm_eval/tasks/<family>/`` that names it)."""
    import re

    import lm_eval.tasks

    root = Path(lm_eval.tasks.__file__).parent / family
    for path in sorted(root.rglob("*.yaml")):
        if re.search(rf"^task: {re.escape(task)}\s*$", path.read_text(encoding="utf-8"), re.M):
            return path
    raise DataError(f"lm-eval {lm_eval_version()} has no task '{task}' under {root}")


LM_EVAL_CODES = {"zh": "zh-Hans", "jp": "ja"}
"""lm-eval's language suffixes that are not ISO 639 codes of one language: its ``zh`` tasks are in
Simplified Chinese, its ``jp`` is Japanese."""


@lru_cache(maxsize=None)
def lm_eval_languages(family: str, prefix: str) -> dict[str, str]:
    """bloomline language → lm-eval task, for every ``<prefix><code>`` task lm-eval defines under
    ``lm_eval/tasks/<family>/`` (its codes, ``deu_Latn`` or ``de``, read by bloomline/languages.py):
    a language added to a task by lm-eval is one bloomline evaluates, with no table to keep. Read
    from the YAML files without importing lm-eval (seconds)."""
    import re
    from importlib.util import find_spec

    from bloomline import languages

    spec = find_spec("lm_eval")
    root = Path(list(spec.submodule_search_locations or [])[0]) / "tasks" / family  # type: ignore[union-attr]
    pattern = re.compile(rf"^task: ({re.escape(prefix)}(\S+))\s*$", re.M)
    out: dict[str, str] = {}
    for path in sorted(root.rglob("*.yaml")):
        for task, code in pattern.findall(path.read_text(encoding="utf-8")):
            lang = languages.resolve(LM_EVAL_CODES.get(code, code))
            if lang is not None:
                out.setdefault(lang, task)
    return out


def lm_eval_version() -> str:
    from importlib.metadata import version

    return version("lm-eval")


class LocalLmEvalTask(Task):
    """One lm-eval task family over local files (module docstring). A subclass names:"""

    family: ClassVar[str]
    """lm-eval's folder of the family (``lm_eval/tasks/<family>``)."""
    subtasks: ClassVar[dict[str, str]]
    """bloomline language code → lm-eval's task of that language."""
    fields: ClassVar[tuple[str, ...]]
    """Fields every record must have (the schema of the dataset lm-eval's task reads)."""
    text_fields: ClassVar[tuple[str, ...]]
    """The fields that make an item's text, in order (what decontamination looks for in a corpus)."""
    needs_data: ClassVar[bool] = True

    def data_files(self, data: str | Path) -> dict[str, Path]:
        """``<lang>.jsonl`` files of the folder, by language."""
        return {p.name[: -len(".jsonl")]: p for p in sorted(Path(data).glob("*.jsonl"))}

    def records(self, path: Path) -> Iterator[tuple[int, dict[str, Any]]]:
        """(line number, record) of a data file; a DataError naming ``path:line`` for a malformed one."""
        for no, rec in task_records(path):
            missing = [k for k in self.fields if k not in rec]
            if missing:
                raise DataError(
                    f"{path}:{no}: the record lacks {', '.join(missing)} ({self.name} records have "
                    f"{', '.join(self.fields)})"
                )
            empty = [k for k in self.fields if isinstance(rec[k], str) and not rec[k].strip()]
            if empty:
                raise DataError(f"{path}:{no}: empty {', '.join(empty)}")
            yield no, rec

    def item_text(self, rec: dict[str, Any]) -> str:
        """An item's text: its ``text_fields`` joined by spaces."""
        return " ".join(str(rec[k]) for k in self.text_fields if isinstance(rec.get(k), str))

    def plan(self, data: str | Path, langs: list[str], want: Optional[list[str]]) -> tuple[dict[str, Path], list[Row]]:
        """The languages to score (their checked files) and the skipped rows of the others."""
        files = self.data_files(data)
        candidates = sorted({*[l for l in langs if l in self.subtasks], *files})
        run, rows = {}, []
        for lang in candidates:
            if want is not None and lang not in want:
                continue
            if lang not in files:
                rows.append(skipped(lang, f"no {Path(data) / (lang + '.jsonl')}"))
            elif lang not in self.subtasks:
                rows.append(
                    skipped(
                        lang,
                        f"lm-eval has no {self.family} prompt for '{lang}' (it has {', '.join(sorted(self.subtasks))})",
                    )
                )
            else:
                try:
                    n = sum(1 for _ in self.records(files[lang]))
                except DataError as e:
                    rows.append(skipped(lang, f"malformed record: {e}"))
                    continue
                if n == 0:
                    rows.append(skipped(lang, f"{files[lang]} holds no records"))
                    continue
                run[lang] = files[lang]
        return run, rows

    def write(self, files: dict[str, Path], folder: str | Path) -> dict[str, str]:
        """lm-eval tasks over ``files`` in ``folder``, one YAML each; language → task name."""
        folder = Path(folder)
        folder.mkdir(parents=True, exist_ok=True)
        names = {}
        for lang, path in files.items():
            name = f"bloomline_{self.subtasks[lang]}"
            conf = {
                "include": str(lm_eval_yaml(self.family, self.subtasks[lang])),
                "task": name,
                "dataset_path": "json",
                "dataset_name": None,
                "dataset_kwargs": {"data_files": {"test": str(Path(path).resolve())}},
                "training_split": None,
                "validation_split": None,
                "fewshot_split": None,
                "test_split": "test",
                "metric_list": [{"metric": m, "aggregation": "mean", "higher_is_better": True} for m in METRICS],
            }
            (folder / f"{name}.yaml").write_text(
                json.dumps(conf, ensure_ascii=False, indent=1) + "\n", encoding="utf-8"
            )
            names[lang] = name
        return names

    def run(self, ctx: Context) -> list[Row]:
        files, rows = self.plan(ctx.spec.data, ctx.index.languages, ctx.spec.langs)
        if not files:
            return rows
        with tempfile.TemporaryDirectory(prefix="bloomline-tasks-") as work:
            names = self.write(files, work)
            lm = lm_of(ctx)
            try:
                res = run_lm_eval(lm, list(names.values()), work, ctx.spec.limit)
            except Exception as e:  # lm-eval's own code on a record it cannot take: this task only
                why = f"lm-eval failed: {type(e).__name__}: {str(e).splitlines()[0][:200] if str(e) else ''}"
                return rows + [skipped(lang, why) for lang in names]
        for lang, name in names.items():
            out = res["results"][name]
            n = int(res["n-samples"][name]["effective"])
            for m in METRICS:  # (lm-eval writes the stderr of a single item as "N/A")
                rows.append(Row(lang, m, float(out[f"{m},none"]), number(out.get(f"{m}_stderr,none")), n))
            ctx.progress(f"{self.name} {lang}: acc {out['acc,none']:.3f} over {n} items")
        return with_means(rows)


def number(x: Any) -> Optional[float]:
    """``x`` as a float, or None where lm-eval has none ("N/A", a missing key)."""
    try:
        return float(x)
    except (TypeError, ValueError):
        return None


def lm_of(ctx: Context) -> Any:
    """The lm-eval ``LM`` of the task's model: HFLM around the in-memory ``BloomForCausalLM`` of a
    model in this process; around the ranks (eval/tasks/lm_eval_model.py) for a parallel one."""
    from eval.model import LocalModel, TransformersModel
    from training.hf.to_hf import hf_config, hf_model, hf_tokenizer

    tok = ctx.index.manifest["tokenizer"]
    tokenizer, eos = hf_tokenizer(ctx.tokenizer_file), int(tok["eos_id"])
    if isinstance(ctx.model, TransformersModel):  # another architecture: its own class, as lm-eval's hf loads it
        return in_memory_lm(ctx.model.hf, tokenizer, ctx.model.cfg.seq_len, eos, str(ctx.model.device))
    if isinstance(ctx.model, LocalModel):
        model = hf_model(ctx.model.bloom, tok)
        return in_memory_lm(model, tokenizer, ctx.model.cfg.seq_len, eos, str(ctx.model.device))
    from transformers import BloomConfig

    from eval.tasks.lm_eval_model import evalmodel_lm

    conf = {k: v for k, v in hf_config(ctx.model.cfg, tok, "float32").items() if k != "architectures"}
    return evalmodel_lm(ctx.model, BloomConfig(**conf), tokenizer, ctx.model.cfg.seq_len, eos, BATCH)


def in_memory_lm(model: Any, tokenizer: Any, max_length: int, eos_id: int, device: str = "cpu") -> Any:
    """lm-eval's HFLM around an in-memory model: what ``--model hf --model_args
    pretrained=EXPORT,max_length=L,prefix_token_id=EOS`` builds from an export."""
    from lm_eval.models.huggingface import HFLM

    return HFLM(
        pretrained=model,
        tokenizer=tokenizer,
        backend="causal",
        max_length=max_length,
        batch_size=BATCH,
        prefix_token_id=eos_id,
        device=device,
    )


def export_lm_args(hf_dir: str | Path, max_length: int, eos_id: int) -> str:
    """The ``--model_args`` of lm-eval's own run on an export, equal to :func:`in_memory_lm`."""
    return f"pretrained={hf_dir},max_length={max_length},dtype=float32,prefix_token_id={eos_id}"


def run_lm_eval(
    model: Any,
    tasks: list[str],
    folder: str | Path,
    limit: Optional[int],
    model_args: Optional[str] = None,
    log_samples: bool = False,
    device: str = "cpu",
) -> dict[str, Any]:
    """``lm_eval.simple_evaluate`` of ``tasks`` written in ``folder``, offline: ``model`` an HFLM, or
    ``"hf"`` with ``model_args`` (lm-eval's own run on an export, on ``device``). The process's
    environment is as it was afterwards."""
    with offline():
        import lm_eval
        from lm_eval.tasks import TaskManager

        return lm_eval.simple_evaluate(
            model=model,
            model_args=model_args,
            tasks=tasks,
            limit=limit,
            task_manager=TaskManager(include_path=str(folder), include_defaults=False),
            batch_size=BATCH,
            device=device,
            log_samples=log_samples,
        )


@contextmanager
def offline() -> Iterator[None]:
    """The hub switched off for transformers, datasets and huggingface_hub (no machine of ours
    reaches it), and no progress bars; the environment as it was afterwards."""
    keys = ("HF_HUB_OFFLINE", "HF_DATASETS_OFFLINE", "TRANSFORMERS_OFFLINE", "TQDM_DISABLE")
    before = {k: os.environ.get(k) for k in keys}
    os.environ.update({k: "1" for k in keys})
    try:
        yield
    finally:
        for k, v in before.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v
