"""The interval methods an evaluation's ``interval`` parameter may name (:data:`METHODS`), what each one is
(:data:`METHOD_TEXT`, for a row's ``info["ci"]``) and the check of a grid or flag value (:func:`parse_method`).

They live apart from :mod:`evalkit.evals.stats`, which computes the intervals with numpy and scipy and
re-exports these names: an evaluation's parameters (its folder's ``params.py``) read this module, so
``run --help`` lists their flags without importing either.
"""

from __future__ import annotations

from evalkit.errors import EvalkitError

METHODS = ("t", "bootstrap")
METHOD_TEXT = {
    "t": "95% studentized jackknife (t, n-1 df) over {units}",
    "bootstrap": "95% paired percentile bootstrap over {units}",
}


def parse_method(value, flag: str) -> str:
    """A grid or flag value naming an interval method, checked (``parse`` of an eval's ``interval`` param)."""
    if value not in METHODS:
        raise EvalkitError(f"interval method {value!r} is not known: use {flag} {' or '.join(METHODS)}")
    return value
