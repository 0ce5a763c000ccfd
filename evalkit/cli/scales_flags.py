"""``--scales-model MODEL --scales-format FORMAT``: the user's word on what a static scale table without
its JSON sidecar was made for (:mod:`evalkit.kv.scale_table`), for the commands that take scale files
(``run --schemes``, ``sweep``, ``calibrate --scales``, ``sensitivity --scheme``, ``conformance --engine vllm``).

On ``run``, ``sweep``, ``sensitivity`` and ``conformance`` the flags become the scheme options ``+scales_model=MODEL+scales_format=FORMAT``
of every static scheme (the grid's equivalent: write those options in its scheme strings), so the
declaration travels with the scheme into the run, its run id and its stored rows. Both flags or
neither; given without any static scheme they are refused, never ignored.
"""

from __future__ import annotations

from evalkit.errors import EvalkitError


def add_scales_arguments(p) -> None:
    p.add_argument(
        "--scales-model",
        default=None,
        metavar="MODEL",
        help="the model a static scale table without its .json sidecar was made for (as --model names it); "
        "with --scales-format",
    )
    p.add_argument(
        "--scales-format",
        default=None,
        metavar="FORMAT",
        help="the format such a table's scales were calibrated for (e.g. fp8_e4m3); with --scales-model",
    )


def declared(args) -> tuple[str, str] | None:
    """(model, format) from the flags, None without them; EvalkitError when only one is given."""
    model, fmt = getattr(args, "scales_model", None), getattr(args, "scales_format", None)
    if model is None and fmt is None:
        return None
    if model is None or fmt is None:
        missing = "--scales-format" if fmt is None else "--scales-model"
        raise EvalkitError(
            f"--scales-model and --scales-format go together: add {missing} naming what the table was made for"
        )
    from evalkit.kv.formats import FORMATS

    if fmt not in FORMATS:
        raise EvalkitError(f"--scales-format {fmt} is not a format: use one of {', '.join(sorted(FORMATS))}")
    return model, fmt


def with_declared(schemes: list, args) -> list:
    """``schemes`` (Scheme objects) with the flags' declaration on each static one; unchanged without the
    flags (:func:`evalkit.kv.scheme.declare_scales`)."""
    pair = declared(args)
    if pair is None:
        return schemes
    from evalkit.kv.scheme import declare_scales

    return declare_scales(schemes, *pair)
