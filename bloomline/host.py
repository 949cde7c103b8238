"""Facts about the machine this process runs on."""

from __future__ import annotations

import os


def available_cpus() -> int:
    """CPU cores this process may run on (its affinity mask, which containers and ``taskset``
    narrow), not the machine's total that ``os.cpu_count()`` reports."""
    if hasattr(os, "sched_getaffinity"):
        return len(os.sched_getaffinity(0))
    return os.cpu_count() or 1
