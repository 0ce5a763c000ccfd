"""Per-layer sensitivity of a KV scheme, and which layers to keep in BF16.

Two sweeps over the layers, each one evaluation per layer against the unquantized baseline:

- *one layer*: only layer i quantized (``+skip=`` every other layer): what layer i costs alone;
- *all but one*: every layer quantized except i (``+skip=i``): what keeping layer i in BF16 saves,
  ``gain_i = KL(all layers) - KL(all but i)``, which accounts for interactions with the rest.

Layers are ranked by gain (then by their one-layer KL). The recommendation keeps the top-k layers
in BF16 for k = 0, 1, 2, ..., measuring each set, and stops at the first set whose mean KL (or
relative perplexity change) is at or below the target: the greedy answer to "the smallest set
that reaches the target", measured rather than extrapolated. Its memory cost is the exact KV cache
bytes (:func:`evalkit.kv.memory.model_cache_bytes`) at a stated context against full quantization.

The quality numbers come from a *measure*: ``measure(scheme) -> {metric: (value, ci_low, ci_high)}``.
:func:`perplexity_measure` builds it from :class:`evalkit.evals.perplexity.evaluation.PerplexityEval` (mean
KL per token, perplexity change, top-1 agreement, bootstrap intervals over windows, the number of
windows and tokens; the baseline is computed once); tests pass other measures through the same boundary.

Cost and trust. Every evaluation of the sweeps costs about the same (one forward per window), so
the first one, with every layer quantized, is timed and the others are estimated from it before
they run (:func:`estimate_line`); progress bars follow both sweeps. A small sample can rank layers
by noise, and the greedy set then keeps layers whose benefit was never measured, so
:func:`sample_warnings` says when the sample cannot support the set it recommends: when a paired
test over so few windows could never reach 5 % (the smallest exact two-sided signed-rank p-value
with W windows is 2 / 2^W, above 0.05 up to W = 5), and when kept layers' savings lie inside the
noise, i.e. their all-but-one KL interval contains the all-layers KL, or overlaps the interval of
the best layer left quantized (the order between them is not resolved).
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import pandas as pd

from evalkit.errors import EvalkitError
from evalkit.kv.memory import attention_layers, model_cache_bytes
from evalkit.kv.scheme import Scheme, parse_scheme

Measure = Callable[[Scheme], dict[str, tuple[float, float | None, float | None]]]
KL, PPL_REL, PPL = "kl_mean", "ppl_delta_rel", "ppl_delta"
N_WINDOWS, N_TOKENS = "n_windows", "n_tokens"  # the sample behind a measure (where it says)
ALPHA = 0.05  # the intervals are 95 %: a difference a paired test cannot call at this level is noise


def perplexity_measure(lm, params: dict | None = None, workdir: Path | None = None) -> Measure:
    """KL / perplexity change of a scheme against the baseline, from the perplexity eval."""
    from evalkit.evals.perplexity.evaluation import PerplexityEval
    from evalkit.models.loading import cache_root

    ev = PerplexityEval(params or {})
    ev.prepare(lm, Path(workdir) if workdir else cache_root() / "work")

    def measure(scheme: Scheme) -> dict:
        rows = [r for r in ev.evaluate(lm, scheme) if not r.labels]
        out = {r.metric: (r.value, r.ci_low, r.ci_high) for r in rows}
        windows = next((r.info.get("n_windows") for r in rows if r.metric == KL and r.info.get("n_windows")), None)
        if windows is not None:
            out[N_WINDOWS] = (float(windows), None, None)
        return out

    return measure


def with_skip(scheme: Scheme, skip) -> Scheme:
    return dataclasses.replace(scheme, skip_layers=tuple(sorted(skip)))


def check_scheme(scheme: Scheme | str) -> Scheme:
    scheme = parse_scheme(scheme) if isinstance(scheme, str) else scheme
    if scheme.is_unscaled:
        raise EvalkitError(f"sensitivity needs a quantized scheme, not {scheme}: e.g. --scheme fp8_e4m3/tensor/dynamic")
    if scheme.skip_layers:
        raise EvalkitError(
            f"scheme {scheme} already skips layers: give it without +skip=, sensitivity chooses the layers"
        )
    return scheme


def layer_table(
    lm, scheme: Scheme | str, measure: Measure, layers: list[int] | None = None, progress: bool = False
) -> tuple[pd.DataFrame, dict]:
    """One row per layer with one-layer and all-but-one metrics; also returns the all-layers metrics."""
    scheme = check_scheme(scheme)
    every = list(attention_layers(lm.layout))
    layers = every if layers is None else layers
    bad = [i for i in layers if i not in every]
    if bad:
        raise EvalkitError(f"layers {bad} are not attention layers of this model (0..{lm.layout.num_layers - 1})")
    start = time.perf_counter()
    full = measure(scheme)
    rows = []
    it = layers
    if progress:
        from tqdm import tqdm

        tqdm.write(estimate_line(len(layers), time.perf_counter() - start, len(every)))
        it = tqdm(layers, desc="layers", unit="layer")
    for i in it:
        one = measure(with_skip(scheme, [j for j in every if j != i]))
        but = measure(with_skip(scheme, [i]))
        row = {"layer": i}
        for tag, m in (("one", one), ("all_but", but)):
            for metric in (KL, PPL_REL, PPL):
                if metric in m:
                    value, lo, hi = m[metric]
                    row[f"{metric}_{tag}"], row[f"{metric}_{tag}_lo"], row[f"{metric}_{tag}_hi"] = value, lo, hi
        row["gain"] = full[KL][0] - row[f"{KL}_all_but"]
        rows.append(row)
    table = pd.DataFrame(rows)
    order = table.sort_values(["gain", f"{KL}_one"], ascending=False).index
    table.loc[order, "rank"] = range(1, len(order) + 1)
    table["rank"] = table["rank"].astype(int)
    return table.sort_values("rank").reset_index(drop=True), full


@dataclass
class Recommendation:
    keep: tuple[int, ...]
    scheme: str
    reached: bool
    target: dict
    metrics: dict
    context: int
    bytes_all_quantized: int
    bytes_recommended: int
    bytes_bf16: int
    steps: list[dict] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)  # where the sample cannot support the set (sample_warnings)

    @property
    def extra_bytes(self) -> int:
        return self.bytes_recommended - self.bytes_all_quantized

    def summary(self) -> str:
        gib = 2**30
        met = " and ".join(f"{k} <= {v:g}" for k, v in self.target.items())
        head = (f"keep layers {list(self.keep)} in BF16" if self.keep else "keep no layer in BF16") + f": {self.scheme}"
        status = "reaches" if self.reached else "does NOT reach"
        kl = self.metrics.get(KL, (float("nan"),))[0]
        rel = self.metrics.get(PPL_REL, (float("nan"),))[0]
        return (
            f"{head}\n  {status} {met} (KL {kl:.4g} nats/token, perplexity change {rel:+.3%})\n"
            f"  KV cache for one {self.context}-token sequence: {self.bytes_recommended / gib:.4f} GiB "
            f"(all quantized {self.bytes_all_quantized / gib:.4f}, BF16 {self.bytes_bf16 / gib:.4f}; "
            f"+{self.extra_bytes / 2**20:.2f} MiB for the kept layers)"
            + "".join(f"\n  WARNING: {w}" for w in self.warnings)
        )


def _meets(metrics: dict, target: dict) -> bool:
    return all(metric in metrics and metrics[metric][0] <= bound for metric, bound in target.items())


def recommend(
    lm,
    scheme: Scheme | str,
    measure: Measure,
    table: pd.DataFrame,
    full: dict,
    *,
    target_kl: float | None = None,
    target_ppl_rel: float | None = None,
    context: int = 8192,
    max_keep: int | None = None,
    progress: bool = False,
) -> Recommendation:
    """Keep the top-ranked layers in BF16, one more at a time, until the target is reached."""
    scheme = check_scheme(scheme)
    target = {}
    if target_kl is not None:
        target[KL] = float(target_kl)
    if target_ppl_rel is not None:
        target[PPL_REL] = float(target_ppl_rel)
    if not target:
        raise EvalkitError(
            "give a target: --target-kl (mean KL, nats/token) or --target-ppl-rel (e.g. 0.001 for 0.1 %)"
        )
    if target.get(KL, 0.0) < 0:
        raise EvalkitError(f"--target-kl must be >= 0 (a mean KL in nats per token), got {target[KL]}")
    if context <= 0:
        raise EvalkitError(f"--context must be a positive number of tokens, got {context}")
    order = list(table.sort_values("rank")["layer"])
    every = list(attention_layers(lm.layout))
    limit = len(every) if max_keep is None else min(max_keep, len(every))
    steps, keep, metrics = [], (), full
    sizes = range(limit + 1)
    if progress:
        from tqdm import tqdm

        sizes = tqdm(sizes, desc="kept sets", unit="set")
    for k in sizes:
        keep = tuple(sorted(order[:k]))
        if k == len(every):
            metrics = {KL: (0.0, 0.0, 0.0), PPL_REL: (0.0, 0.0, 0.0), PPL: (0.0, 0.0, 0.0)}  # nothing quantized
        elif k:
            metrics = measure(with_skip(scheme, keep))
        steps.append({"keep": list(keep), **{m: v[0] for m, v in metrics.items() if m in (KL, PPL_REL, PPL)}})
        if _meets(metrics, target):
            break
    if progress:
        sizes.close()
    final = with_skip(scheme, keep) if len(keep) < len(every) else Scheme()
    return Recommendation(
        keep=keep,
        scheme=str(final),
        reached=_meets(metrics, target),
        target=target,
        metrics=metrics,
        context=context,
        bytes_all_quantized=model_cache_bytes(lm.layout, scheme, context),
        bytes_recommended=model_cache_bytes(lm.layout, final, context),
        bytes_bf16=model_cache_bytes(lm.layout, Scheme(), context),
        steps=steps,
        warnings=sample_warnings(table, full, keep),
    )


def estimate_line(n_layers: int, seconds: float, n_every: int) -> str:
    """What the layer sweep will take, from one timed evaluation (each costs about the same)."""
    n = 2 * n_layers
    return (
        f"sensitivity: {n} more evaluations (one layer / all but one, {n_layers} layers) at about {seconds:.1f} s each "
        f"(the all-layers one just took that): about {_duration(n * seconds)}; a recommendation adds up to "
        f"{n_every} more ({_duration(n_every * seconds)})"
    )


def _duration(seconds: float) -> str:
    return (
        f"{seconds:.0f} s"
        if seconds < 120
        else f"{seconds / 60:.1f} min"
        if seconds < 7200
        else f"{seconds / 3600:.1f} h"
    )


def sample_warnings(table: pd.DataFrame, full: dict, keep: tuple[int, ...]) -> list[str]:
    """Why the sample behind ``table`` cannot support keeping ``keep`` in BF16 (empty when it can, or
    when nothing is kept). See the module docstring: too few windows for any paired difference to
    reach 5 %, and kept layers whose saving is inside the intervals."""
    if not keep:
        return []
    out = []
    windows = full.get(N_WINDOWS, (None,))[0]
    tokens = full.get(N_TOKENS, (None,))[0]
    sample = ", ".join(
        x for x in (f"{windows:.0f} windows" if windows else "", f"{tokens:.0f} tokens" if tokens else "") if x
    )
    if windows and 2.0 / 2**windows > ALPHA:
        out.append(
            f"the sample ({sample}) is too small for this choice: with {windows:.0f} windows no paired difference can "
            f"reach {ALPHA:.0%} (smallest signed-rank p-value 2/2^{windows:.0f} = {2.0 / 2**windows:.3g}); "
            "measure more windows (--perplexity-max-windows, a longer corpus) before relying on it"
        )
    lo, hi = f"{KL}_all_but_lo", f"{KL}_all_but_hi"
    if lo not in table or hi not in table or table[[lo, hi]].isna().any().any():
        return out
    all_kl = full[KL][0]
    t = table.set_index("layer")
    kept = [i for i in keep if i in t.index]
    rest = t.drop(index=kept, errors="ignore")
    noise = [i for i in kept if t.loc[i, lo] <= all_kl <= t.loc[i, hi]]
    unresolved = []
    if not rest.empty:
        best = rest.sort_values("rank").iloc[0]  # the layer that would have been kept next
        unresolved = [i for i in kept if t.loc[i, lo] <= best[hi] and best[lo] <= t.loc[i, hi]]
    if noise or unresolved:
        parts = []
        if noise:
            parts.append(
                f"{len(noise)} of the {len(kept)} kept layers save no more KL than the noise (their all-but-one "
                f"95 % interval contains the all-layers KL {all_kl:.3g}): {sorted(noise)}"
            )
        if unresolved:
            parts.append(
                f"{len(unresolved)} are not separated from layer {int(best.name)}, the best one left quantized "
                f"(overlapping intervals): {sorted(unresolved)}"
            )
        out.append(
            f"the sample ({sample or 'as measured'}) does not support this set: "
            + "; ".join(parts)
            + "; measure more tokens before keeping these layers"
        )
    return out


def plot(table: pd.DataFrame, path: str | Path, title: str = "") -> Path:
    """Per-layer bars: KL with only that layer quantized, and the KL saved by keeping it in BF16."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    t = table.sort_values("layer")
    fig, axes = plt.subplots(2, 1, figsize=(max(6, 0.3 * len(t) + 2), 6), sharex=True)
    for ax, col, label in (
        (axes[0], f"{KL}_one", "KL, only this layer quantized"),
        (axes[1], "gain", "KL saved by keeping this layer in BF16"),
    ):
        err = None
        lo, hi = f"{KL}_one_lo", f"{KL}_one_hi"
        if col == f"{KL}_one" and lo in t and t[lo].notna().all():
            err = [t[col] - t[lo], t[hi] - t[col]]
        ax.bar(t["layer"], t[col], yerr=err, capsize=2, color="tab:blue" if col != "gain" else "tab:orange")
        ax.set_ylabel("nats / token")
        ax.set_title(label, fontsize=9)
        ax.grid(alpha=0.3, axis="y")
    axes[1].set_xlabel("layer")
    import textwrap

    fig.suptitle("\n".join(textwrap.wrap(title, 80)), fontsize=9)
    fig.tight_layout()
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path


def metric_rows(table: pd.DataFrame) -> list[dict]:
    """The table as result rows (``labels.layer``), the form evalkit.report plots read."""
    rows = []
    for _, r in table.iterrows():
        for tag, name in (("one", "one_layer"), ("all_but", "all_but_one")):
            for metric in (KL, PPL_REL):
                key = f"{metric}_{tag}"
                if key in r and pd.notna(r[key]):
                    lo, hi = r.get(f"{key}_lo"), r.get(f"{key}_hi")
                    rows.append(
                        {
                            "metric": f"{metric}_{name}",
                            "value": float(r[key]),
                            "ci_low": None if pd.isna(lo) else float(lo),
                            "ci_high": None if pd.isna(hi) else float(hi),
                            "labels": {"layer": int(r["layer"])},
                            "info": {"rank": int(r["rank"])},
                        }
                    )
    return rows
