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


def test_readme_test_command_is_what_ci_runs():
    repo = Path(__file__).resolve().parents[1]
    readme = (repo / "README.md").read_text()
    ci = (repo / ".ci" / "run").read_text()
    test_cmd = [l for l in readme.splitlines() if "pytest" in l and l.startswith("python3 -m venv")]
    assert len(test_cmd) == 1
    assert test_cmd[0] in ci.splitlines()


def test_readme_first_command_runs_the_main_job():
    """The README's first run command, after the install, is `bloomline pipeline` (tested end to
    end in tests/flows/test_pipeline.py)."""
    readme = (Path(__file__).resolve().parents[1] / "README.md").read_text()
    first = next(l for l in readme.splitlines() if l.startswith("python3 -m venv"))
    assert first.endswith("pip install -e . && bloomline pipeline --out out/demo")
