"""bloomline core: contracts shared by every stage (config loading, language registry, file I/O)."""

from pathlib import Path

__version__ = "0.1.0"
REPO = Path(__file__).resolve().parents[1]
"""The source tree's root: configs/, the sample corpus and the modules a stage's code digest reads."""
