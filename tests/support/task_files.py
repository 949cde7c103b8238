"""Task data files in the schemas of the datasets lm-eval's multilingual tasks read (xstorycloze,
xcopa, xnli, xwinograd, belebele), made of pieces of a language's text: :func:`pieces` cuts them,
:func:`record` makes item ``k`` of a task from them, :func:`write` writes a language's items as the
folder's ``<lang>.jsonl``. For the tests that compare bloomline's tasks with lm-eval's own run
(tests/eval/tasks/test_lm_eval_local.py, a published model, a model imported from Hugging Face)."""

from __future__ import annotations

import json
from pathlib import Path


def pieces(demo: Path, lang: str, n: int = 40) -> list[str]:
    """Short pieces of the language's validation text: 5 words, or 8 characters where there are no spaces."""
    from eval.harness import validation_documents

    text = " ".join(validation_documents(demo, lang))
    if lang.startswith("zh"):
        text = "".join(text.split())
        return [text[i * 8 % len(text) :][:8] for i in range(n)]
    words = text.split() * 2
    return [" ".join(words[i * 5 % (len(words) // 2) :][:5]) for i in range(n)]


def record(task: str, p: list[str], k: int) -> dict:
    """Item ``k`` of ``task`` in the schema of the dataset lm-eval's task reads."""
    q = p[k * 6 : (k + 1) * 6]
    if task == "xstorycloze":
        return {
            **{f"input_sentence_{i + 1}": q[i] for i in range(4)},
            "sentence_quiz1": q[4],
            "sentence_quiz2": q[5],
            "answer_right_ending": 1 + k % 2,
        }
    if task == "xcopa":
        return {
            "premise": q[0] + ".",
            "choice1": q[1],
            "choice2": q[2],
            "question": ("cause", "effect")[k % 2],
            "label": k % 2,
        }
    if task == "xnli":
        return {"premise": q[0] + " " + q[1], "hypothesis": q[2], "label": k % 3}
    if task == "xwinograd":
        return {"sentence": f"{q[0]} _ {q[1]}", "option1": q[2], "option2": q[3], "answer": "12"[k % 2]}
    return {
        "flores_passage": " ".join(q[:3]),
        "question": q[3],
        **{f"mc_answer{i}": p[k * 6 + i + 2] for i in range(1, 5)},
        "correct_answer_num": "1234"[k % 4],
    }


def write(folder: Path, lang: str, recs: list[dict]) -> None:
    folder.mkdir(parents=True, exist_ok=True)
    (folder / f"{lang}.jsonl").write_text(
        "".join(json.dumps(r, ensure_ascii=False) + "\n" for r in recs), encoding="utf-8"
    )
