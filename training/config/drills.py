"""Switches for tests and fault drills, kept out of the user's recipe: read from the environment of
the command, which the ranks on its node inherit, so no recipe, checkpoint or reuse key holds them.

- ``BLOOMLINE_CPU_FP16=1``: allow fp16 on a CPU without fp16 kernels (DeepSpeed refuses it there);
  torch's reference half-precision kernels run it, slowly. How the tests cover the fp16 path on
  CPU machines.
- ``BLOOMLINE_NAN_AT=120,240``: the loss of these steps is made NaN, to check end to end that bad
  batches are skipped and reported (``skip_reason: bad_loss``) and that your alerting sees them.
"""

from __future__ import annotations

import os

from bloomline.errors import ConfigError

CPU_FP16 = "BLOOMLINE_CPU_FP16"
NAN_AT = "BLOOMLINE_NAN_AT"


def cpu_fp16() -> bool:
    """Whether fp16 may train on a CPU without fp16 kernels."""
    return os.environ.get(CPU_FP16, "") == "1"


def nan_at() -> frozenset[int]:
    """The steps whose loss the fault drill makes NaN (none unless set)."""
    value = os.environ.get(NAN_AT, "").strip()
    try:
        return frozenset(int(s) for s in value.split(",") if s.strip())
    except ValueError:
        raise ConfigError(NAN_AT, f"{value!r}: expected step numbers separated by commas, e.g. 120,240") from None
