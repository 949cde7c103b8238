"""What the tests need beyond bloomline itself, and the benchmarks in bench/ share with them.

* :mod:`~tests.support.chaos`: kill ``bloomline pipeline``'s driver anywhere, rerun it, compare with an
  uninterrupted run (tests/flows/stages/test_pipeline.py; ``python -m bench.chaos`` at length);
* :mod:`~tests.support.fuzz_inputs`: hostile inputs for ``prepare`` as Hypothesis strategies;
* :mod:`~tests.support.proctree`: a command's whole process tree sampled for memory over time;
* :mod:`~tests.support.grow`, :mod:`~tests.support.skewed`: corpora grown from ../shared/corpus by
  per-language Markov walks, in the source's proportions or in ROOTS';
* the baselines the benchmarks compare bloomline with, checked here: Megatron-LM's fixed batches
  (:mod:`~tests.support.fixed_sampler`), datatrove's pipeline (:mod:`~tests.support.datatrove_baseline`)
  and its MinHash dedup (:mod:`~tests.support.dedup_agreement`).

Imported as ``tests.support.NAME`` from the repository root (pyproject.toml's pytest ``pythonpath``;
``python -m bench.NAME`` runs from there too). A helper more than one test module uses lives here,
never in a test module: no test imports another. The tests of what the benchmarks share are in
tests/bench/.
"""

from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
"""The repository: the commands these modules start run from it."""
