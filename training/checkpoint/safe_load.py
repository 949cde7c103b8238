"""Loading checkpoint files without running code: the one way any ``.pt`` file is read.

A ``.pt`` file is a pickle, and a pickle can name any callable to run while it loads (``torch.load``
with ``weights_only=False`` runs it). ``bloomline evaluate``, ``export`` and ``train`` read folders
a user points them at — a colleague's run, a downloaded checkpoint — so every file is loaded with
torch's restricted unpickler (``weights_only=True``), which builds only tensors, containers and
plain values, plus the few classes below that DeepSpeed's state holds, each read as data (its
fields set, none of its methods run). A file that names anything else is refused in one line,
naming the file and the type.

DeepSpeed itself loads with ``weights_only=False`` (its checkpoint engine, the universal
converter, ``zero_to_fp32``): those run inside :func:`enforced`, which makes every ``torch.load``
of the process this one. :func:`check_folder` loads every file of a folder this way ahead
(memory-mapped: the tensors' bytes are not read), so that a bad file is refused in one line
before ranks or servers start.
"""

from __future__ import annotations

import contextlib
import pickle
import re
from pathlib import Path
from typing import Any, Iterator

from bloomline.errors import CheckpointError


def _numpy_types() -> list[Any]:
    """numpy's, for the RNG state DeepSpeed saves with the model (``np.random.get_state()``: a
    uint32 array)."""
    import numpy as np

    numpy_core = np._core.multiarray if hasattr(np, "_core") else np.core.multiarray
    dtypes = [type(np.dtype(t)) for t in (np.uint32, np.int64, np.float64, np.float32)]
    return [np.ndarray, np.dtype, numpy_core._reconstruct, *dtypes]


def _deepspeed_types() -> list[Any]:
    """DeepSpeed's, in its optimizer states (read off every layout the trainer writes: ZeRO 0-3,
    PP, fp16 and bf16, the universal form). Imported only for a file that names one (~0.3 s)."""
    from deepspeed.runtime.fp16.loss_scaler import DynamicLossScaler, LossScaler
    from deepspeed.runtime.zero.config import ZeroStageEnum
    from deepspeed.utils.tensor_fragment import fragment_address

    return [LossScaler, DynamicLossScaler, ZeroStageEnum, fragment_address]


DEEPSPEED_TYPES = frozenset(
    {
        "deepspeed.runtime.fp16.loss_scaler.LossScaler",
        "deepspeed.runtime.fp16.loss_scaler.DynamicLossScaler",
        "deepspeed.runtime.zero.config.ZeroStageEnum",
        "deepspeed.utils.tensor_fragment.fragment_address",
    }
)
"""The names of :func:`_deepspeed_types`, known without importing DeepSpeed."""

_ALLOWED: list[Any] = []
_UNSUPPORTED = re.compile(r"GLOBAL ([\w.]+)")


def _named(e: Exception, path: Any) -> str | None:
    """The global a refused file names: from torch's message, else from its static scan."""
    import torch

    found = _UNSUPPORTED.search(str(e))
    if found:
        return found.group(1)
    if not isinstance(path, (str, Path)):
        return None
    try:
        return ", ".join(torch.serialization.get_unsafe_globals_in_checkpoint(path)) or None
    except Exception:  # noqa: BLE001 - the file is refused either way
        return None


class RefusedCheckpoint(CheckpointError):
    """A file that names something other than data: refused, never a damaged file to fall back from."""


def safe_load(path: str | Path, mmap: bool = False) -> Any:
    """``torch.load`` of ``path`` on the CPU with no code run (see the module docstring); raises
    CheckpointError in one line for a missing or unreadable file, RefusedCheckpoint for one that
    names code. ``mmap``: map the tensors' bytes instead of reading them (a check of what the file
    holds)."""
    import torch

    path = Path(path)
    if not path.is_file():
        raise CheckpointError(f"{path} is missing")
    return _restricted(torch.load, path, "cpu", mmap)


def _restricted(load: Any, f: Any, map_location: Any, mmap: bool) -> Any:
    """``load`` (torch's own ``torch.load``) of ``f`` with the restricted unpickler and the allowlist."""
    import torch

    if not _ALLOWED:
        _ALLOWED.extend(_numpy_types())
    for _ in range(2):
        try:
            with torch.serialization.safe_globals(_ALLOWED):
                return load(f, map_location=map_location, weights_only=True, mmap=mmap)
        except pickle.UnpicklingError as e:
            what = _named(e, f)
            if what in DEEPSPEED_TYPES and len(_ALLOWED) == len(_numpy_types()):
                _ALLOWED.extend(_deepspeed_types())
                if hasattr(f, "seek"):
                    f.seek(0)
                continue
            raise RefusedCheckpoint(
                f"{f} is refused: it names {what or 'a Python object'}, which is not a type a checkpoint "
                f"holds, and loading it could run code (training/CHECKPOINT.md, 'What is safe to load')"
            ) from None
        except Exception as e:  # a truncated or overwritten file: torch's own error says little
            raise CheckpointError(
                f"{f} is unreadable: damaged or not a checkpoint ({type(e).__name__}: {_first_line(e)})"
            ) from None
    raise AssertionError("unreachable")


@contextlib.contextmanager
def enforced() -> Iterator[None]:
    """Within the block, every ``torch.load`` of this process (and of processes it forks) loads as
    :func:`safe_load` does, whatever its caller asked for: DeepSpeed's loaders (its engine's resume,
    the universal converter, ``zero_to_fp32``) pass ``weights_only=False``. So the bytes unpickled
    are the bytes checked, with no window between a check and DeepSpeed's own load in which a
    file could be swapped (they all call ``torch.load`` through the module, at call time). A process
    started otherwise ('spawn', or 'forkserver': Python 3.14's default) imports torch afresh, unpatched:
    code that lets DeepSpeed start workers inside the block makes them forks (reshard.py, _forked_workers)."""
    import torch

    original = torch.load

    def load(f: Any, map_location: Any = None, pickle_module: Any = None, **kwargs: Any) -> Any:
        return _restricted(original, f, map_location, bool(kwargs.get("mmap")))

    torch.load = load
    try:
        yield
    finally:
        torch.load = original


def _first_line(e: Exception) -> str:
    return (str(e).splitlines() or [""])[0][:200]


def check_folder(folder: str | Path, recursive: bool = True) -> int:
    """Load every ``*.pt`` file in ``folder`` (and its subfolders: the universal form) as
    :func:`safe_load` does, memory-mapped; CheckpointError for the first one refused or
    unreadable. Call before anything that loads with ``weights_only=False`` reads the folder.
    Returns how many files were checked."""
    folder = Path(folder)
    files = sorted(folder.rglob("*.pt") if recursive else folder.glob("*.pt"))
    for f in files:
        safe_load(f, mmap=True)
    return len(files)
