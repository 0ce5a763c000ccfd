"""Calibration: static K/V scales from data, written as a scale table (:mod:`evalkit.kv.scale_table`).

The model runs over calibration text inside :func:`evalkit.integration.observe.observe_kv` with a
:class:`KVObserver`, so statistics are taken exactly where the storage cache quantizes: post-RoPE
K and V, per layer and per KV head, K and V separately, padding left out. Nothing is changed in the
forward pass (the observer only reads), so calibration cannot be poisoned by its own quantization.

Methods (scale = statistic / format max, the convention vLLM uses: value = code * scale):

- ``amax``: the largest |x| seen; nothing clips.
- ``percentile:P``: the P-th percentile of |x| (e.g. ``percentile:99.99``), from a 2048-bin
  histogram per layer and head whose range doubles (merging bin pairs) whenever a larger value
  arrives, so one pass suffices; the result is the upper edge of the bin holding the percentile.
- ``mse``: a second pass measures the exact squared quantization error of every candidate scale
  ``amax / max * 2**(-k/8)`` (k = 0..16) over the same data and keeps the best.

Calibration text defaults to ``stdlib-docs``: the docstrings of a fixed list of Python standard
library modules, with every docstring that shares a 13-word sequence with the embedded evaluation
corpus dropped, so it is disjoint from the default perplexity text by construction. Both texts are
frozen files taken from CPython 3.11.7 (:mod:`evalkit.data.frozen`), not the running interpreter's
docstrings, which differ by Python version (259,323 characters on 3.11.7, 263,867 on 3.12.1).
Any corpus the perplexity eval accepts works too; evalkit warns when more than 1 % of the
calibration text's 13-word sequences also occur in the evaluation text.
"""

from __future__ import annotations

import hashlib
import re
import warnings
from dataclasses import dataclass

import torch

from evalkit.data.corpus import OVERLAP_NGRAM, ngrams, tokenizer_adds_bos
from evalkit.errors import EvalkitError, NonFiniteKVError
from evalkit.integration.observe import observe_kv
from evalkit.kv.formats import KVFormat, get_format
from evalkit.kv.quantize import quantize_dequantize
from evalkit.kv.scale_table import ScaleTable
from evalkit.kv.scheme import Granularity, GranularityKind
from evalkit.models.info import KVLayout

DEFAULT_CORPUS = "stdlib-docs"
BINS = 2048
MSE_STEPS = 17  # candidates amax/max * 2**(-k/8), k = 0..16 (down to a quarter)
OVERLAP_WARN = 0.01


# -- text ------------------------------------------------------------------------------------------
def overlap_fraction(calib_text: str, eval_text: str, n: int = OVERLAP_NGRAM) -> float:
    """Fraction of the calibration text's n-word sequences that also occur in the evaluation text."""
    a = ngrams(calib_text, n)
    return len(a & ngrams(eval_text, n)) / len(a) if a else 0.0


def embedded_eval_text() -> str:
    """The default evaluation text (the perplexity eval's embedded corpus)."""
    return load_text("embedded")


def stdlib_docs_text() -> str:
    """The ``stdlib-docs`` calibration text: frozen docstrings of CPython 3.11.7's standard library
    (:mod:`evalkit.data.frozen`; how they were chosen: :mod:`evalkit.data.freeze`), the same on every
    Python, disjoint from the embedded corpus (no shared 13-word sequence)."""
    from evalkit.data.frozen import stdlib_docs

    return stdlib_docs()


def load_text(source: str) -> str:
    """Calibration or evaluation text for a corpus name: ``stdlib-docs`` here, the rest via evalkit.data.corpus."""
    if source == DEFAULT_CORPUS:
        return stdlib_docs_text()
    from evalkit.data.corpus import load_corpus

    return load_corpus(source).text


def calibration_batches(tokenizer, text: str, samples: int, seq_len: int, bos: bool) -> torch.Tensor:
    """(n, seq_len) token ids: consecutive non-overlapping chunks of the tokenized text."""
    ids = tokenizer(text, add_special_tokens=False, return_attention_mask=False)["input_ids"]
    body = seq_len - 1 if bos else seq_len
    if body <= 0:
        raise EvalkitError(f"--seq-len {seq_len} is too short: use at least 2")
    if len(ids) < body:
        raise EvalkitError(
            f"the calibration text has {len(ids)} tokens, fewer than one sequence of {seq_len}: use a longer corpus or a smaller --seq-len"
        )
    n = min(samples, len(ids) // body)
    if n < samples:
        warnings.warn(f"calibration text gives only {n} sequences of {seq_len} tokens, not {samples}", stacklevel=2)
    rows = torch.tensor(ids[: n * body], dtype=torch.long).reshape(n, body)
    if bos:
        rows = torch.cat([torch.full((n, 1), tokenizer.bos_token_id, dtype=torch.long), rows], dim=1)
    return rows


# -- statistics ------------------------------------------------------------------------------------
class KVObserver:
    """Records K/V statistics per layer and KV head; changes nothing.

    Run it with ``observe_kv(model, observer)``. ``mse_candidates`` (which -> (L, C, H) scales)
    switches on the exact error measurement of the second mse pass.
    """

    def __init__(
        self,
        layout: KVLayout,
        fmt: str = "fp8_e4m3",
        histograms: bool = False,
        mse_candidates: dict[str, torch.Tensor] | None = None,
        granularity: str = "tensor",
    ):
        self.layout, self.fmt = layout, get_format(fmt)
        L, H = layout.num_layers, layout.num_kv_heads
        self.amax = {w: torch.zeros(L, H, dtype=torch.float64) for w in "kv"}
        self.count = {w: torch.zeros(L, dtype=torch.long) for w in "kv"}
        self.histograms = histograms
        self.hist = {w: torch.zeros(L, H, BINS, dtype=torch.float64) for w in "kv"} if histograms else None
        self.hist_range = {w: torch.zeros(L, dtype=torch.float64) for w in "kv"}
        self.pending_zeros = {w: torch.zeros(L, H, dtype=torch.float64) for w in "kv"}
        self.mse_candidates = mse_candidates
        self.granularity = granularity
        if mse_candidates is not None:
            shape = (L, MSE_STEPS) if granularity == "tensor" else (L, MSE_STEPS, H)
            self.sse = {w: torch.zeros(shape, dtype=torch.float64) for w in "kv"}

    def __call__(self, which: str, layer_idx: int, x: torch.Tensor, valid: torch.Tensor | None = None) -> None:
        if not bool(torch.isfinite(x).all()):
            raise NonFiniteKVError(
                f"layer {layer_idx} {which.upper()} contains NaN or inf during calibration: "
                "load the model in float32 or bfloat16 rather than float16"
            )
        xf = x.detach().float()
        if valid is not None:
            xf = xf.masked_fill(~valid[:, None, :, None], 0.0)
        per_head = xf.abs().transpose(0, 1).reshape(xf.shape[1], -1)  # (H, B*S*D)
        if valid is not None:
            keep = valid[:, None, :, None].expand_as(xf).transpose(0, 1).reshape(xf.shape[1], -1)[0]
            per_head = per_head[:, keep]
        if per_head.shape[1] == 0:  # every position is padding
            return
        self.count[which][layer_idx] += per_head.shape[1]
        self.amax[which][layer_idx] = torch.maximum(self.amax[which][layer_idx], per_head.amax(dim=1).double())
        if self.histograms:
            self._histogram(which, layer_idx, per_head)
        if self.mse_candidates is not None:
            self._sse(which, layer_idx, xf)

    def _histogram(self, which: str, layer: int, a: torch.Tensor) -> None:
        top = float(a.max())
        rng = float(self.hist_range[which][layer])
        if top == 0.0 and rng == 0.0:
            self.pending_zeros[which][layer] += a.shape[1]
            return
        if rng == 0.0:
            rng = top
        hist = self.hist[which][layer]
        while top > rng:  # double the range: bin pairs merge into the lower half
            hist = torch.cat(
                [hist.view(hist.shape[0], BINS // 2, 2).sum(-1), torch.zeros_like(hist[:, : BINS // 2])], dim=1
            )
            rng *= 2
        for h in range(a.shape[0]):
            hist[h] += torch.histc(a[h].double(), bins=BINS, min=0.0, max=rng)
        hist[:, 0] += self.pending_zeros[which][layer]
        self.pending_zeros[which][layer] = 0
        self.hist[which][layer] = hist
        self.hist_range[which][layer] = rng

    def _sse(self, which: str, layer: int, xf: torch.Tensor) -> None:
        cands = self.mse_candidates[which][layer]  # (C, H) scales (tensor: equal across heads)
        gran = Granularity(GranularityKind.HEAD)
        for c in range(cands.shape[0]):
            scale = cands[c].float().reshape(1, -1, 1, 1)
            err = (quantize_dequantize(xf, self.fmt, gran, scale=scale) - xf).double().pow(2)
            if self.granularity == "tensor":
                self.sse[which][layer, c] += err.sum()
            else:
                self.sse[which][layer, c] += err.sum(dim=(0, 2, 3))


def percentile_from_histogram(hist: torch.Tensor, rng: float, p: float) -> torch.Tensor:
    """Upper edge of the bin holding the p-th percentile; ``hist`` (..., BINS) over [0, rng]."""
    cdf = hist.cumsum(-1)
    total = cdf[..., -1:]
    idx = (cdf < total * (p / 100.0)).sum(-1).clamp(max=hist.shape[-1] - 1)
    return (idx + 1).double() * (rng / hist.shape[-1])


# -- the whole procedure -----------------------------------------------------------------------------
@dataclass(frozen=True)
class Method:
    name: str  # amax | percentile | mse
    percentile: float | None = None

    def __str__(self) -> str:
        return f"percentile:{self.percentile:g}" if self.name == "percentile" else self.name


def parse_method(text: str) -> Method:
    if text in ("amax", "mse"):
        return Method(text)
    m = re.fullmatch(r"percentile:([0-9.]+)", text)
    if m:
        p = float(m.group(1))
        if not 0 < p <= 100:
            raise EvalkitError(f"percentile {p} is out of range: give 0 < P <= 100, e.g. percentile:99.99")
        return Method("percentile", p)
    raise EvalkitError(f"unknown calibration method {text!r}: use amax, percentile:P (e.g. percentile:99.99) or mse")


def _run(model, batches: torch.Tensor, observer: KVObserver, batch_size: int) -> None:
    with torch.no_grad(), observe_kv(model, observer):
        for i in range(0, batches.shape[0], batch_size):
            chunk = batches[i : i + batch_size].to(next(model.parameters()).device)
            model(input_ids=chunk, use_cache=False)


def _check_nonzero(stat: torch.Tensor, granularity: str) -> None:
    for which, t in stat.items():
        bad = (t <= 0).nonzero()
        if bad.numel():
            layer = int(bad[0, 0])
            where = f"layer {layer}" + (f" KV head {int(bad[0, 1])}" if granularity == "head" else "")
            raise EvalkitError(
                f"calibration statistics for {where} {which.upper()} are all zero, so no scale can be derived: "
                "use more or different calibration text (or keep that layer unquantized with +skip=...)"
            )


def calibrate(
    lm,
    *,
    corpus: str = DEFAULT_CORPUS,
    samples: int = 32,
    seq_len: int = 512,
    granularity: str = "tensor",
    method: str | Method = "amax",
    fmt: str = "fp8_e4m3",
    batch_size: int = 4,
    bos: bool | None = None,
    eval_corpus: str | None = "embedded",
    text: str | None = None,
) -> ScaleTable:
    """Run ``lm`` (a :class:`evalkit.models.loading.LoadedModel`) over calibration text; return the scale table."""
    import evalkit

    if granularity not in ("tensor", "head"):
        raise EvalkitError(f"granularity {granularity!r}: static scales are per tensor or per head")
    if samples <= 0 or seq_len <= 0 or batch_size <= 0:
        raise EvalkitError("--samples, --seq-len and --batch-size must be positive")
    method = parse_method(method) if isinstance(method, str) else method
    kv_fmt: KVFormat = get_format(fmt)
    if kv_fmt.is_unscaled or kv_fmt.asymmetric:
        raise EvalkitError(f"static scales exist for symmetric formats (fp8_*, int8, int4), not {fmt}")
    if lm.layout.is_mla:
        raise EvalkitError("static per-layer scales for MLA latents are not supported yet: use dynamic scales")
    text = load_text(corpus) if text is None else text
    overlap = None
    if eval_corpus:
        overlap = overlap_fraction(text, load_text(eval_corpus))
        if overlap > OVERLAP_WARN:
            warnings.warn(
                f"{overlap:.1%} of the calibration text ({corpus}) also occurs in the evaluation text ({eval_corpus}): "
                "scales fitted on evaluation data flatter the results; calibrate on another corpus",
                stacklevel=2,
            )
    if lm.layout.max_positions and seq_len > lm.layout.max_positions:
        raise EvalkitError(
            f"--seq-len {seq_len} exceeds the model's maximum length {lm.layout.max_positions}: use a shorter one"
        )
    use_bos = tokenizer_adds_bos(lm.tokenizer) if bos is None else bos
    batches = calibration_batches(lm.tokenizer, text, samples, seq_len, use_bos)
    observer = KVObserver(lm.layout, fmt, histograms=method.name == "percentile", granularity=granularity)
    _run(lm.model, batches, observer, batch_size)
    amax = {w: observer.amax[w] if granularity == "head" else observer.amax[w].amax(dim=1) for w in "kv"}
    _check_nonzero(amax, granularity)
    if method.name == "amax":
        stat = amax
    elif method.name == "percentile":
        stat = {}
        for w in "kv":
            h = observer.hist[w] if granularity == "head" else observer.hist[w].sum(dim=1)
            rng = observer.hist_range[w]
            p = torch.stack(
                [percentile_from_histogram(h[i], float(rng[i]), method.percentile) for i in range(h.shape[0])]
            )
            stat[w] = torch.minimum(p, amax[w])
        _check_nonzero(stat, granularity)
    else:
        factors = torch.tensor([2.0 ** (-k / 8) for k in range(MSE_STEPS)], dtype=torch.float32)
        H = lm.layout.num_kv_heads
        cands = {}
        for w in "kv":
            base = amax[w].float() / kv_fmt.max
            base = base.unsqueeze(1).expand(-1, H) if granularity == "tensor" else base
            cands[w] = base[:, None, :] * factors[None, :, None]  # (L, C, H)
        mse_obs = KVObserver(lm.layout, fmt, mse_candidates=cands, granularity=granularity)
        _run(lm.model, batches, mse_obs, batch_size)
        stat = {}
        for w in "kv":
            best = mse_obs.sse[w].argmin(dim=1)  # (L,) or (L, H)
            if granularity == "tensor":
                stat[w] = cands[w][torch.arange(cands[w].shape[0]), best, 0]
            else:
                stat[w] = torch.gather(cands[w], 1, best[:, None, :]).squeeze(1)
    if method.name == "mse":  # the candidate whose error was measured, exactly
        scales = stat
    else:  # float32 division, as the dynamic path does: amax scales equal dynamic ones on the same data
        scales = {w: stat[w].float() / kv_fmt.max for w in "kv"}
    meta = {
        "model": lm.name,
        "config_hash": lm.config_hash,
        "num_layers": lm.layout.num_layers,
        "num_kv_heads": lm.layout.num_kv_heads,
        "granularity": granularity,
        "method": str(method),
        "format": fmt,
        "corpus": corpus,
        "corpus_hash": hashlib.sha256(text.encode()).hexdigest()[:16],
        "samples": int(batches.shape[0]),
        "seq_len": seq_len,
        "tokens": int(batches.numel()),
        "bos": use_bos,
        "evalkit_version": evalkit.__version__,
        "scale_convention": "value = code * scale (vLLM)",
        "eval_corpus_overlap": None if overlap is None else round(overlap, 6),
    }
    return ScaleTable(scales["k"], scales["v"], meta)


def table_stats(table: ScaleTable) -> str:
    """A one-line summary for the command line."""

    def rng(t):
        return f"[{float(t.min()):.4g}, {float(t.max()):.4g}]"

    return f"k_scale {tuple(table.k_scale.shape)} in {rng(table.k_scale)}, v_scale in {rng(table.v_scale)}"


__all__ = [
    "KVObserver",
    "calibrate",
    "load_text",
    "overlap_fraction",
    "parse_method",
    "percentile_from_histogram",
    "calibration_batches",
    "DEFAULT_CORPUS",
]
