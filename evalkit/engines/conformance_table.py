"""The end-to-end conformance table's shared columns: scheme, the engine's and the emulation's perplexity
change, the gap and the per-token r with their intervals, the noise quantiles and the verdict
(:mod:`evalkit.engines.conformance_e2e` computes them). Each engine's report (vLLM's
:mod:`evalkit.engines.vllm.conformance_report`, llama.cpp's :mod:`evalkit.engines.llamacpp.conformance`)
prints these first and adds its own columns after them. Plain formatting, no numpy: reading a report
stays light.
"""

from __future__ import annotations

# the end-to-end table's columns every engine prints first (each engine's report adds its own after them)
COMPARISON_HEADERS = (
    "scheme",
    "engine Δppl %",
    "emulation Δppl %",
    "gap pp [95% CI]",
    "r [95% CI]",
    "noise: gap q95, r q05",
    "verdict",
)


def interval_cell(row: dict, key: str, fmt: str, prefix: str = "") -> str:
    """``value [low, high]`` of a row's ``gap`` (pp) or ``r``, the value alone for rows of an older
    evalkit without intervals, and nothing when the row lacks it; ``prefix`` picks another comparison
    (``rne_``)."""
    keys = ("gap_pp", "gap_low", "gap_high") if key == "gap" else (key, key + "_low", key + "_high")
    value, low, high = (row.get(prefix + k) for k in keys)
    if value is None:
        return ""
    return f"{value:{fmt}} [{low:{fmt}}, {high:{fmt}}]" if low is not None else f"{value:{fmt}}"


def comparison_cells(row: dict) -> list[str]:
    """One end-to-end row's cells under :data:`COMPARISON_HEADERS`."""
    noise = row.get("noise_gap_pp", row.get("noise_pp"))
    return [
        row["scheme"],
        f"{row['engine_dppl_pct']:+.2f}",
        f"{row['emulation_dppl_pct']:+.2f}",
        interval_cell(row, "gap", "+.2f"),
        interval_cell(row, "r", ".3f"),
        "" if noise is None else f"{noise:.2f}, {row.get('noise_r'):.3f}",
        str(row.get("verdict", "")),
    ]
