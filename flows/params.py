"""Flow parameters without secrets. Prefect keeps every flow run's parameters in its database, so
a caller in this process passes them masked (:func:`masked`) and the flow takes the real values
back (:func:`real`), held here, in memory, keyed by the masked form. A flow run started from
elsewhere (a deployment run from the API) gets its parameters as they were sent."""

from __future__ import annotations

import hashlib
import json
from typing import Any

from bloomline.secrets import mask_tree, remember

_REAL: dict[str, Any] = {}


def _key(params: Any) -> str:
    return hashlib.sha256(json.dumps(params, sort_keys=True, default=str).encode()).hexdigest()


def masked(params: Any) -> Any:
    """``params`` with its secrets masked, to hand to a flow; the real ones stay in this process."""
    m = mask_tree(params)
    if m != params:
        _REAL[_key(m)] = params
        remember(params)  # an error quoting one of them, in any form, is masked too
    return m


def real(params: Any) -> Any:
    """The real parameters behind ``params`` when a caller in this process masked them, else ``params``."""
    return _REAL.get(_key(params), params)
