"""Every recipe in configs/ loads into its schema (litgpt-style)."""

from pathlib import Path

import pytest

from bloomline.config import load_config
from flows.config import schema_for

CONFIGS = sorted((Path(__file__).resolve().parents[1] / "configs").rglob("*.yaml"))


def test_there_are_recipes():
    assert CONFIGS


@pytest.mark.parametrize("path", CONFIGS, ids=lambda p: f"{p.parent.name}/{p.name}")
def test_recipe_loads(path):
    cfg = load_config(schema_for(path), path)
    for s in getattr(cfg, "sources", []):
        assert Path(s.path).exists(), f"{path}: source {s.path} does not exist"


def restated_defaults(raw: dict, default: dict, path: str = "") -> list[str]:
    """The keys of a recipe whose value is the schema's default (one definition per default)."""
    out = []
    for k, v in raw.items():
        d = default.get(k, object()) if isinstance(default, dict) else object()
        if isinstance(v, dict) and isinstance(d, dict):
            out += restated_defaults(v, d, f"{path}{k}.")
        elif v == d:
            out.append(f"{path}{k}")
    return out


def test_the_data_recipes_restate_no_default():
    """A data recipe says what it changes; the defaults live in data_prep/config/. The per-language
    thresholds are left alone: their block is generated whole (data_prep/calibration/)."""
    import yaml

    from bloomline.config import to_dict
    from data_prep.config import PrepareConfig

    default = to_dict(PrepareConfig())
    for path in (p for p in CONFIGS if p.parent.name == "data"):
        raw = yaml.safe_load(path.read_text())
        raw.get("filters", {}).pop("languages", None)
        assert restated_defaults(raw, default) == [], path


def test_readme_test_command_is_what_ci_runs():
    repo = Path(__file__).resolve().parents[1]
    readme = (repo / "README.md").read_text()
    ci = (repo / ".ci" / "run").read_text()
    test_cmd = [l for l in readme.splitlines() if "pytest" in l and l.startswith("python3 -m venv")]
    assert len(test_cmd) == 1
    assert test_cmd[0] in ci.splitlines()


def test_readme_first_command_runs_the_main_job():
    """The README's first run command, after the install, is `bloomline pipeline` (tested end to
    end in tests/flows/stages/test_pipeline.py)."""
    readme = (Path(__file__).resolve().parents[1] / "README.md").read_text()
    first = next(l for l in readme.splitlines() if l.startswith("python3 -m venv"))
    assert first.endswith("pip install -e . && bloomline pipeline --out out/demo")
