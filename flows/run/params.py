"""Flow parameters without secrets. Prefect keeps every flow run's parameters in its database, so a
caller in this process passes them masked, and hands the real values (and a live progress
display, which is no JSON either) beside them in an :class:`InProcess`, which Prefect does not record.
A flow run started elsewhere (a deployment run from the API) has no InProcess: it runs on its
parameters as they were sent, with no display. Nothing is held between calls: what a flow runs
on is what its caller passed it."""

from __future__ import annotations

from typing import Any, TypeVar

from bloomline.config import from_dict
from bloomline.secrets import mask_tree, remember

T = TypeVar("T")


class InProcess:
    """What a caller in this process hands a flow beside its JSON parameters: ``params``, the
    parameters with their real values (their masked form is the flow's recorded parameter), and
    ``progress``, a live display, ``dask``, a Dask client already running (a cluster the caller
    started while Prefect's server did; flows/run/api_server.py), and ``checked``, what the caller
    already checked of ``params`` against the flow's other arguments, as the typed object the
    flow's entry would make of them (the train flow's ``Checked`` recipe, the evaluate flow's
    checkpoint record, the prepare and pipeline flows' recipe): each input is checked once, where it enters, and the flow checks again
    only for a caller that did not. Prefect records it as ``"<InProcess>"``: its encoder cannot read an
    object with slots and no iteration (prefect.flows.Flow.serialize_parameters' fallback), so
    neither a secret nor the display reaches the API."""

    __slots__ = ("params", "progress", "dask", "checked")

    def __init__(self, params: Any = None, progress: Any = None, dask: Any = None, checked: Any = None):
        self.params = params
        self.progress = progress
        self.dask = dask
        self.checked = checked

    def __iter__(self):  # what makes Prefect's encoder give up (dict(obj) fails, vars(obj) too)
        raise TypeError("an InProcess stays in this process")

    def __repr__(self) -> str:
        return "<InProcess>"


def flow_args(params: Any, progress: Any = None, dask: Any = None, checked: Any = None) -> tuple[Any, InProcess]:
    """(``params`` with its secrets masked, for the flow's record; the :class:`InProcess` holding the
    real ones, ``progress``, ``dask`` and ``checked``, for the flow's ``local`` argument)."""
    m = mask_tree(params)
    if m != params:
        remember(params)  # an error quoting one of them, in any form, is masked too
    return m, InProcess(params, progress, dask, checked)


def unmasked(params: Any, local: InProcess | None) -> Any:
    """The parameters a flow runs on: the real ones its caller handed in ``local``, else ``params``
    as sent. Refuses an InProcess that does not belong to ``params`` (a caller's mistake, not a user's)."""
    if local is None or local.params is None:
        return params
    if mask_tree(local.params) != params:
        raise ValueError("the InProcess handed to this flow holds other parameters than the flow's")
    return local.params


def typed(schema: type[T], params: Any, local: InProcess | None) -> T:
    """The recipe a flow runs on: the ``schema`` object its caller checked and handed
    (``local.checked``), else made and checked here from the parameters (:func:`unmasked`)."""
    sent = unmasked(params, local)  # refuses an InProcess of other parameters either way
    if local is not None and isinstance(local.checked, schema):
        return local.checked
    return from_dict(schema, sent)
