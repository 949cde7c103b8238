"""``prepare``'s runs as the tests make and compare them: :func:`demo_cfg`, the demo recipe
(configs/data/demo.yaml) reading another source, a local folder or a URL (importable by the
processes a test starts and kills); :func:`tree_bytes`, an output folder's files byte for byte,
less the two FORMAT.md leaves out of its byte-identical contract (``run_stats.json``, the ``.lock``
of the job writing the folder) and any ``.work`` folder. For the tests of prepare's stages and
dedup, of its runs on an object store, and of the command's runs killed and resumed."""

from __future__ import annotations

from pathlib import Path

from bloomline.config import load_config
from data_prep.config import PrepareConfig
from tests.support import REPO


def demo_cfg(source: str) -> PrepareConfig:
    cfg = load_config(PrepareConfig, REPO / "configs/data/demo.yaml", [])
    cfg.sources[0].path = source
    return cfg


def tree_bytes(root: Path) -> dict[str, bytes]:
    return {
        str(p.relative_to(root)): p.read_bytes()
        for p in sorted(root.rglob("*"))
        if p.is_file() and p.name not in ("run_stats.json", ".lock") and ".work" not in p.parts
    }
