"""The mixture page's weights as drawn (eval/pages/mixture.py weight_steps): a decision taken after
step s holds from step s+1 until the next one."""

from eval.pages.mixture import weight_steps

LOG = [
    {"step": 0, "weights": {"sw": 0.5, "en": 0.5}},
    {"step": 10, "weights": None},  # looked, kept the weights: no point of its own
    {"step": 20, "weights": {"sw": 0.7, "en": 0.3}},
]


def test_each_decision_holds_from_the_next_step_to_the_last():
    xs, ys = weight_steps(LOG, 40)
    assert xs == [1, 21, 40]
    assert ys == {"en": [0.5, 0.3, 0.3], "sw": [0.5, 0.7, 0.7]}


def test_a_decision_after_the_last_metrics_line_still_shows():
    xs, _ = weight_steps(LOG, 15)  # metrics read before step 20's decision was logged
    assert xs == [1, 21, 21]


def test_a_fixed_rule_gets_the_page_with_its_rule_and_epochs_escaped(tmp_path):
    import json

    from eval.pages.mixture import mixture_page

    evil = "<script>alert(1)</script>"
    start = {"rule": "start", "blend": {"rule": "weights", "weights": {evil: 1.0, "en": 1.0}}}
    (tmp_path / "mixture.jsonl").write_text(
        json.dumps({"step": 0, "weights": {"sw": 0.5, "en": 0.5}, "cause": start, "inputs": None}) + "\n"
    )
    rows = [
        {"step": s, "lang_tokens": {"sw": 10, "en": 10}, "lang_epochs": {"sw": 0.5 * s, "en": 0.1 * s}} for s in (1, 2)
    ]
    (tmp_path / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    html = mixture_page(tmp_path)
    assert html is not None and "Epochs seen per language by step 2" in html
    assert "rule weights" in html and evil not in html and "&lt;script&gt;alert(1)&lt;/script&gt;" in html
