"""Whether the scale files that static schemes name (``+scales=PATH``) exist and hold what the run needs.

A static scheme loads its table when the run binds it to the loaded model
(:func:`evalkit.kv.scale_table.load_scale_table`); a missing or broken file then stops the run after
the model has loaded. Here the same file is found as the run finds it
(:func:`evalkit.data.resources.resolve_calibration_file`: the path, else evalkit's shipped
``calibration/``) and its safetensors header is read, not its tensors (``safe_open``: names, shapes,
dtypes): it must parse, hold ``k_scale`` and ``v_scale`` of one shape, per tensor ``(layers,)`` or per
head ``(layers, kv_heads)`` as the scheme's granularity says, with the shape of each planned model
whose config is here, and its JSON sidecar must read and name the model and format it was made
for (or the scheme must declare them, ``+scales_model=``/``+scales_format=``), a format the scheme's. The values (zero, negative, non-finite scales) and the config hash are checked when the
table loads, as before.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

from evalkit.errors import EvalkitError, ScaleError
from evalkit.kv.scheme import ScaleSource, Scheme, parse_scheme
from evalkit.models.folder import Arch, model_arch
from evalkit.sweep.preflight.planned import PlannedRun, Problem, distinct

NAMES = ("k_scale", "v_scale")


@dataclass(frozen=True)
class ScaleHeader:
    """What a scale table's header and sidecar say, without its tensors."""

    path: Path
    shapes: dict[str, tuple[int, ...]]
    meta: dict = field(default_factory=dict)

    @property
    def granularity(self) -> str:
        return "tensor" if len(self.shapes["k_scale"]) == 1 else "head"


def read_header(name: str) -> ScaleHeader:
    """The header of the scale table a scheme names; ScaleError (one line) when it is missing, unreadable,
    not safetensors, or lacks ``k_scale``/``v_scale`` of one shape of rank 1 or 2."""
    from safetensors import SafetensorError, safe_open

    from evalkit.data.resources import resolve_calibration_file
    from evalkit.kv.scale_table import sidecar_path

    path = resolve_calibration_file(name)
    if not path.is_file():
        raise ScaleError(
            f"static scale file {name} does not exist: make one with `python -m evalkit calibrate` or import one"
        )
    try:
        with safe_open(str(path), framework="pt") as f:
            shapes = {n: tuple(f.get_slice(n).get_shape()) for n in NAMES if n in f.keys()}
    except OSError as exc:
        raise ScaleError(f"static scale file {name} cannot be read ({exc.strerror or exc})") from None
    except SafetensorError as exc:
        raise ScaleError(f"static scale file {name} is not a readable safetensors file ({exc})") from None
    missing = [n for n in NAMES if n not in shapes]
    if missing:
        raise ScaleError(f"static scale file {name} has no {' or '.join(missing)} entry: recalibrate or re-export it")
    k, v = shapes["k_scale"], shapes["v_scale"]
    if k != v:
        raise ScaleError(f"static scale file {name}: k_scale {k} and v_scale {v} differ in shape")
    if len(k) not in (1, 2):
        raise ScaleError(
            f"static scale file {name} holds scales of shape {k}: a table is (layers,) per tensor or "
            "(layers, kv_heads) per head; recalibrate"
        )
    meta = {}
    sidecar = sidecar_path(path)
    if sidecar.is_file():
        try:
            meta = json.loads(sidecar.read_text())
        except (OSError, ValueError) as exc:
            raise ScaleError(
                f"the sidecar {sidecar} of static scale file {name} is not readable JSON ({exc})"
            ) from None
    return ScaleHeader(path, shapes, meta if isinstance(meta, dict) else {})


def header_problem(header: ScaleHeader, scheme: Scheme) -> str | None:
    """Why the table cannot serve ``scheme``'s granularity, in one line; None when it can."""
    name = scheme.static_path
    want = scheme.granularity.kind.value
    if header.granularity != want:
        return (
            f"static scale file {name} holds {header.granularity} scales but the scheme asks for {want}: "
            f"use a {want} calibration"
        )
    return None


def format_problem(header: ScaleHeader, scheme: Scheme) -> str | None:
    """Why the table cannot serve ``scheme``'s format (it names no model and format, by its sidecar or
    the scheme's ``+scales_model=``/``+scales_format=``, or another format), in one line; None when it can."""
    from evalkit.kv.scale_table import Declared, provenance

    name = scheme.static_path
    declared = Declared(scheme.scales_model, scheme.scales_format) if scheme.scales_model is not None else None
    try:
        made_for = provenance(header.path, header.meta, declared)["format"]
    except ScaleError as exc:
        return str(exc)
    if made_for != scheme.format:
        return (
            f"static scales in {name} were calibrated for {made_for} (scale = amax / its max), not "
            f"{scheme.format}: calibrate for {scheme.format} or use {made_for}"
        )
    return None


def shape_problem(header: ScaleHeader, scheme: Scheme, arch: Arch) -> str | None:
    """Why the table's shape does not fit the model (another model's table), in one line; None when it fits
    or the model's layout is not known here."""
    layout = arch.layout
    if layout is None:
        return None
    expected = (layout.num_layers,) if header.granularity == "tensor" else (layout.num_layers, layout.num_kv_heads)
    shape = header.shapes["k_scale"]
    if shape == expected:
        return None
    return (
        f"static scale file {scheme.static_path} has shape {shape} but {arch.name} needs {expected} "
        f"({layout.num_layers} layers, {layout.num_kv_heads} KV heads): it was made for another model"
    )


def check_scale_files(runs: Sequence[PlannedRun]) -> list[Problem]:
    """Each static scheme's scale file, once per file, and its shape against each planned model."""
    headers: dict[str, ScaleHeader | str] = {}
    archs: dict[str, Arch] = {}
    out: list[Problem] = []
    for run in distinct(runs, "scheme", "model"):
        try:
            scheme = parse_scheme(run.scheme)
        except EvalkitError:
            continue  # the grid (or --schemes) reports it
        if scheme.scales is not ScaleSource.STATIC or not scheme.static_path:
            continue
        path = scheme.static_path
        if path not in headers:
            try:
                headers[path] = read_header(path)
            except EvalkitError as exc:
                headers[path] = str(exc)
        header = headers[path]
        if isinstance(header, str):
            out.append(Problem(run.scheme_key, header))
            continue
        name = run.model.name
        arch = archs.get(name) or archs.setdefault(name, model_arch(name))
        reason = header_problem(header, scheme) or shape_problem(header, scheme, arch) or format_problem(header, scheme)
        if reason:
            out.append(Problem(run.scheme_key, reason))
    return out
