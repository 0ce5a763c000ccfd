"""Where the semantics did not change, the single storage path gives the old numbers: to the last
digit on the platform that captured them, within the measured float-rounding spread elsewhere.

``tests/golden/golden_hook_v1.json`` was written by evalkit 094835d, whose perplexity and lm-eval
evaluations quantized K/V inside the attention function. One forward per window or request means
the scales are computed over exactly the tokens the storage cache writes in its first write, so
logits, perplexity, top-1 agreement and lm-eval log-likelihoods must be identical (not close). KL is
the exception since perplexity baseline format 3: the golden KL was computed from full float16
distributions, evalkit now estimates it from a 2 KB summary per token (:mod:`evalkit.evals.kl_topk`),
so it is compared within 1 %, with the summary's proven lower bound at or below it.
Logits are compared by SHA-256 of their float32 bytes (a left-padded batch: real positions only;
padding rows read only padding K/V, which the two paths store differently).

Bit for bit holds on one platform only: another processor rounds the same model's floats
differently, and quantization amplifies that (:mod:`evalkit.runtime.numerics`). The file records the
platform it was captured on. Elsewhere:

* perplexity, KL, top-1 agreement and lm-eval log-likelihoods must agree within ``SAFETY`` times
  the spread measured for that quantity and scheme (the tables below; the unquantized baseline
  within ``BASELINE_REL``, relative), **where that tolerance is smaller than the effect checked**:
  the distance between the golden value and what a quantizer that does nothing would give (the
  unquantized value: KL 0, change 0, agreement 1, the baseline's perplexity and log-likelihoods).
  A check whose tolerance is not smaller could not fail for a no-op quantizer; it is reported as
  NOT CHECKED in a :class:`NotChecked` warning (shown in pytest's warnings summary), never passed.
  E.g. fp8_e4m3/head/dynamic's change of perplexity is 0.020 against a tolerance of 1.44;
* what the cache *stores* is checked on every platform, from ``tests/golden/golden_storage_v1.json``
  (``tests/float_spread.py`` ``kv_stats``, on the tiny models): per layer, the relative error norm
  of the stored K/V against what ``update`` received and the sum of the dynamic scales, within
  ``SAFETY`` times their measured float spread (``KV_ERR_SPREAD``, ``KV_SCALE_SPREAD``: about 1e-4
  of a value that a no-op quantizer takes to 0), and layer 0's code bytes, which must be equal
  wherever layer 0's K/V are (rounding them is exact elementwise work);
* what is exact by construction stays exact: the identity scheme's logits equal the plain model's
  bit for bit, its perplexity row has KL 0, change 0 and agreement 1;
* logits digests: a digest has no distance, so they are compared only where this architecture's
  plain (unquantized) forward reproduces the golden platform's floats bit for bit (its digest
  equals the golden identity digest); quantization adds only exactly rounded elementwise work, so
  then every scheme's digest must be equal too. Where the plain forward differs, the golden file
  holds nothing a tolerance could compare: the test checks the identity scheme and warns.

On an AMD EPYC (AuthenticAMD/25/17/1, AVX512, MKL_CBWR=AUTO,STRICT) against the Xeon golden file:
llama, qwen2 and gemma3 reproduce all digests; deepseek_v3, gemma2 and gpt2 differ already
unquantized (there 094835d's hook, run on the same machine, gives the same digests as the storage
path, and the same perplexity, top-1 and log-likelihoods: the deviations are the platform's).
"""

from __future__ import annotations

import json
import sys
import warnings

import pytest
import torch

from evalkit.runtime.numerics import platform_record, same_platform

from tests.float_spread import (
    GOLDEN,
    KV_GOLDEN_PATH,
    N_SCORED,
    digest,
    kv_stats,
    lmeval_logliks,
    perplexity_values,
    tiny_logits,
)

KV_GOLDEN = json.loads(KV_GOLDEN_PATH.read_text())
IDENTITY = "auto"


class NotChecked(UserWarning):
    """A golden check that could not fail here (its tolerance is not smaller than its effect)."""


def on_golden_platform(golden: dict = GOLDEN) -> bool:
    """Whether this machine computes the golden file's floats (its recorded platform)."""
    return same_platform(golden.get("platform"), platform_record())


# ---- float-rounding spread ---------------------------------------------------------------------
# Measured with tests/float_spread.py on an AMD EPYC (AuthenticAMD/25/17/1, AVX512, MKL_CBWR=AUTO,STRICT,
# torch 2.13 CPU, transformers 5.24, 2 threads): the golden computations below, with every weight of the
# model multiplied by 1 + 1e-6 * N(0, 1) (seeds 0-7), max deviation from the unperturbed run over the
# 8 seeds, rounded up to 2 digits. Re-measure:  python -m tests.float_spread --eps 1e-6 --seeds 0 1 2 3 4 5 6 7
# (~25 min on 2 cores; it prints these tables and this machine's deviation from the golden file).
# 1e-6 weight noise moves the unquantized outputs at the float-rounding level (perplexity by <= 3.1e-6
# relative, log-likelihoods <= 1.8e-5, tiny-model logits <= 4e-6; on this machine the plain model's
# perplexity differs from the golden platform's by 4.5e-7, its log-likelihoods by 2.7e-6). A quantized
# forward is chaotic in it: eps = 1e-7 (3 seeds) gave spreads of the same size.
# The EPYC's own deviation from the Xeon golden file was at most 1.33 x these maxima (top-1 of the static
# scheme; KL of fp8_e4m3/tensor/dynamic 1.17 x), most well under 1 x.
SAFETY = 3  # tolerance = SAFETY x the measured max deviation
BASELINE_REL = 1e-4  # the unquantized model (perplexity, log-likelihoods), relative; measured <= 1.8e-5
KL_SUMMARY_REL = 0.01  # the 2 KB summary's KL against the golden full-distribution KL (evals/kl_topk.py)

STATIC = "fp8_e4m3/head/static+scales=calibration/smollm2-135m-head-amax.safetensors"
PPL_SPREAD = {  # perplexity, relative
    "fp8_e4m3/head/dynamic": 0.019,
    STATIC: 0.0051,
    "fp8_e4m3/tensor/dynamic": 0.0064,
    "fp8_e4m3/tensor/unit": 0.0094,
    "fp8_e5m2/block16/dynamic": 0.028,
    "int4/token/dynamic": 0.021,
    "int4_asym/group32/dynamic": 0.023,
}
PPL_DELTA_SPREAD = {  # perplexity change from the baseline, absolute
    "fp8_e4m3/head/dynamic": 0.48,
    STATIC: 0.13,
    "fp8_e4m3/tensor/dynamic": 0.16,
    "fp8_e4m3/tensor/unit": 0.24,
    "fp8_e5m2/block16/dynamic": 0.76,
    "int4/token/dynamic": 0.76,
    "int4_asym/group32/dynamic": 0.58,
}
KL_SPREAD = {  # mean KL(baseline || scheme), relative
    "fp8_e4m3/head/dynamic": 0.18,
    STATIC: 0.11,
    "fp8_e4m3/tensor/dynamic": 0.053,
    "fp8_e4m3/tensor/unit": 0.064,
    "fp8_e5m2/block16/dynamic": 0.11,
    "int4/token/dynamic": 0.058,
    "int4_asym/group32/dynamic": 0.087,
}
TOP1_SPREAD = {  # top-1 agreement, absolute (tokens of the 381 scored)
    "fp8_e4m3/head/dynamic": 7 / N_SCORED,
    STATIC: 9 / N_SCORED,
    "fp8_e4m3/tensor/dynamic": 8 / N_SCORED,
    "fp8_e4m3/tensor/unit": 3 / N_SCORED,
    "fp8_e5m2/block16/dynamic": 8 / N_SCORED,
    "int4/token/dynamic": 6 / N_SCORED,
    "int4_asym/group32/dynamic": 9 / N_SCORED,
}
LOGLIK_SPREAD = {  # lm-eval gold log-likelihood per item, absolute nats (4 items: chaotic for whole-tensor scales)
    "fp8_e4m3/block16/dynamic": 0.43,
    "fp8_e5m2/tensor/dynamic": 2.3,
    "int4/tensor/dynamic": 4.0,
}
# Stored K/V of the tiny models (tests/float_spread.py kv_stats), measured the same way on this AMD EPYC
# (AuthenticAMD/26/2/1, AVX512, MKL_CBWR=AUTO,STRICT; eps 1e-6, seeds 0-7, the max over the architectures):
# largest relative change, over layers and K/V, of the error norm ||stored - given|| / ||given|| and of
# the sum of the dynamic scales. A no-op quantizer takes the error norm to 0 (a relative change of 1).
#   python -m tests.float_spread --write-kv-golden --parts kv --seeds 0 1 2 3 4 5 6 7
KV_ERR_SPREAD = {
    "fp8_e4m3/tensor/dynamic": 0.00076,
    "fp8_e4m3/tensor/dynamic+rope=bf16": 5.8e-06,
    "fp8_e4m3/tensor/unit": 0.0029,
    "fp8_e4m3/token/dynamic": 0.0011,
    "int8/group8/dynamic": 0.012,
    "fp8_e4m3/head/dynamic": 0.00012,
    "fp8_e4m3/head/dynamic+skip=0": 9.7e-06,
    "fp8_e4m3fnuz/head/dynamic": 0.00049,
    "fp8_e5m2/block16/dynamic": 1.8e-05,
    "fp8_e5m2/block16/unit": 0.0003,
    "int4/block8/dynamic": 2.9e-06,
    "int4/token/dynamic": 0.0008,
    "int4_asym/group8/dynamic": 4.9e-06,
    "int8_asym/head/dynamic": 0.00094,
    "int8_asym/tensor/dynamic": 0.0027,
    "int8_asym/token/dynamic": 0.0076,
}
KV_SCALE_SPREAD = {
    "fp8_e4m3/tensor/dynamic": 3.8e-05,
    "fp8_e4m3/tensor/dynamic+rope=bf16": 2.6e-06,
    "fp8_e4m3/tensor/unit": 0.0,
    "fp8_e4m3/token/dynamic": 1e-05,
    "int8/group8/dynamic": 0.00012,
    "fp8_e4m3/head/dynamic": 3.4e-05,
    "fp8_e4m3/head/dynamic+skip=0": 1.3e-06,
    "fp8_e4m3fnuz/head/dynamic": 7.2e-06,
    "fp8_e5m2/block16/dynamic": 9.2e-07,
    "fp8_e5m2/block16/unit": 0.0,
    "int4/block8/dynamic": 8.4e-07,
    "int4/token/dynamic": 0.00017,
    "int4_asym/group8/dynamic": 4.9e-07,
    "int8_asym/head/dynamic": 0.00017,
    "int8_asym/tensor/dynamic": 0.00011,
    "int8_asym/token/dynamic": 4.7e-05,
}
# Tiny-model logits (not a tolerance: the golden file holds digests), max |logit change| under the same
# noise: unquantized 1.5e-6..3.6e-6; quantized up to 5.3e-4 (deepseek_v3), 6.6e-4 (gemma2), 4.0e-3 (gemma3),
# 5.2e-4 (gpt2), 1.3e-3 (llama), 2.0e-3 (qwen2): no digest of a quantized forward survives another platform.


def _within(got: float, want: float, tol: float, relative: bool) -> bool:
    limit = tol * (abs(want) if relative else 1.0)
    return abs(got - want) <= limit * (1 + 1e-9) + 1e-15


def _resolves(want: float, noop: float, tol: float, relative: bool) -> bool:
    """Whether a check of ``want`` within ``tol`` can tell it from ``noop``, a quantizer that does nothing."""
    return tol * (abs(want) if relative else 1.0) < abs(want - noop)


def _platform_note(golden: dict = GOLDEN) -> str:
    theirs, here = golden.get("platform") or {}, platform_record()
    return (
        f"golden platform {theirs.get('cpu')} ({theirs.get('cpu_id')}, {theirs.get('cpu_capability')}), "
        f"this is {here['cpu']} ({here['cpu_id']}, {here['cpu_capability']})"
    )


def warn_not_checked(what: str, not_checked: list[str], golden: dict = GOLDEN) -> None:
    if not_checked:
        warnings.warn(
            NotChecked(
                f"{what}: NOT CHECKED off the golden platform ({_platform_note(golden)}), the tolerance is not "
                f"smaller than the effect (a no-op quantizer would pass): {'; '.join(not_checked)}"
            ),
            stacklevel=2,
        )


# ---- the checks (golden values against this run's; used by the tests and by the no-op test) -------------
def perplexity_checks(got: dict[str, dict[str, float]]) -> tuple[dict, list[str]]:
    """(disagreements, checks not made) of perplexity_values' result against the golden file."""
    on_platform = on_golden_platform()
    noop = {"ppl": GOLDEN["perplexity"][IDENTITY]["ppl"], "ppl_delta": 0.0, "top1_agreement": 1.0, "kl_mean": 0.0}
    bad, not_checked = {}, []
    for scheme, want in GOLDEN["perplexity"].items():
        g = got[scheme]
        if on_platform:
            exact = {k: v for k, v in want.items() if k != "kl_mean"}
            if {k: g[k] for k in exact} != exact:
                bad[scheme, "exact"] = ({k: g[k] for k in exact}, exact, "bit for bit")
            kl_spread = 0.0
        elif scheme == IDENTITY:
            if (g["kl_mean"], g["ppl_delta"], g["top1_agreement"]) != (0.0, 0.0, 1.0):  # by construction
                bad[scheme, "identity"] = ((g["kl_mean"], g["ppl_delta"], g["top1_agreement"]), (0, 0, 1), "exact")
            if not _within(g["ppl"], want["ppl"], BASELINE_REL, relative=True):
                bad[scheme, "ppl"] = (g["ppl"], want["ppl"], f"rel {BASELINE_REL}")
            kl_spread = 0.0
        else:
            for metric, table, relative in (
                ("ppl", PPL_SPREAD, True),
                ("ppl_delta", PPL_DELTA_SPREAD, False),
                ("top1_agreement", TOP1_SPREAD, False),
            ):
                tol = SAFETY * table[scheme]
                if not _resolves(want[metric], noop[metric], tol, relative):
                    limit = tol * (abs(want[metric]) if relative else 1.0)
                    effect = abs(want[metric] - noop[metric])
                    not_checked.append(f"{scheme} {metric} (effect {effect:.3g}, tolerance {limit:.3g})")
                elif not _within(g[metric], want[metric], tol, relative):
                    bad[scheme, metric] = (g[metric], want[metric], f"{'rel' if relative else 'abs'} {tol:.3g}")
            kl_spread = SAFETY * KL_SPREAD[scheme]
        # KL: the golden value came from full float16 distributions, ours from the 2 KB summary
        # (evals/kl_topk.py): within 1 % (plus the float spread off the golden platform), and the
        # proven lower bound not above it
        tol = KL_SUMMARY_REL + kl_spread
        if scheme != IDENTITY and not _resolves(want["kl_mean"], 0.0, tol, relative=True):
            not_checked.append(f"{scheme} kl_mean (tolerance {tol:.3g} relative)")
        elif not _within(g["kl_mean"], want["kl_mean"], tol, relative=True):
            bad[scheme, "kl_mean"] = (g["kl_mean"], want["kl_mean"], f"rel {tol:.3g}")
        if not g["kl_lower_bound"] <= want["kl_mean"] * (1 + 1e-3) * (1 + kl_spread):
            bad[scheme, "kl_lower_bound"] = (g["kl_lower_bound"], want["kl_mean"], "bound above the golden KL")
    return bad, not_checked


def lmeval_checks(got: dict[str, dict[str, float]]) -> tuple[dict, list[str]]:
    """(disagreements, checks not made) of lmeval_logliks' result against the golden file."""
    bad, not_checked = {}, []
    if set(got) != set(GOLDEN["lmeval"]):
        return {("schemes",): (sorted(got), sorted(GOLDEN["lmeval"]), "the same schemes")}, []
    baseline = GOLDEN["lmeval"][IDENTITY]
    on_platform = on_golden_platform()
    for scheme, want in GOLDEN["lmeval"].items():
        if set(got[scheme]) != set(want):
            bad[scheme, "docs"] = (sorted(got[scheme]), sorted(want), "the same items")
            continue
        if on_platform:
            if got[scheme] != want:
                bad[scheme, "exact"] = (got[scheme], want, "bit for bit")
            continue
        relative = scheme == IDENTITY
        tol = BASELINE_REL if relative else SAFETY * LOGLIK_SPREAD[scheme]
        skipped = []
        for doc, value in want.items():
            if not relative and not _resolves(value, baseline[doc], tol, relative=False):
                skipped.append(f"{doc} (effect {abs(value - baseline[doc]):.3g})")
            elif not _within(got[scheme][doc], value, tol, relative):
                bad[scheme, doc] = (got[scheme][doc], value, f"{'rel' if relative else 'abs'} {tol:.3g}")
        if skipped:
            not_checked.append(f"{scheme} items {', '.join(skipped)} (tolerance {tol:.3g} nats)")
    return bad, not_checked


def kv_checks(arch: str, got: dict[str, dict]) -> tuple[dict, list[str]]:
    """(disagreements, checks not made) of kv_stats' result for ``arch`` against golden_storage_v1.json."""
    on_platform = on_golden_platform(KV_GOLDEN)
    bad, not_checked = {}, []
    for scheme, want in KV_GOLDEN["tiny"][arch].items():
        g = got[scheme]
        for which in "kv":
            same_input = on_platform or g[f"raw0_{which}"] == want[f"raw0_{which}"]
            if same_input and g[f"codes0_{which}"] != want[f"codes0_{which}"]:
                bad[scheme, f"layer 0 {which.upper()} codes"] = (g[f"codes0_{which}"], want[f"codes0_{which}"], "equal")
            for quantity, spread in (("err", KV_ERR_SPREAD), ("scale", KV_SCALE_SPREAD)):
                tol = 0.0 if on_platform else SAFETY * spread[scheme]
                for layer, (a, b) in enumerate(zip(g[f"{quantity}_{which}"], want[f"{quantity}_{which}"])):
                    if b is None or a is None:
                        if (a is None) != (b is None):
                            bad[scheme, f"layer {layer} {which.upper()} {quantity}"] = (a, b, "both or neither")
                        continue
                    if b and not _resolves(b, 0.0, tol, relative=True):
                        not_checked.append(f"{scheme} layer {layer} {which.upper()} {quantity} (tolerance {tol:.3g})")
                    elif not (a == b if on_platform or not b else _within(a, b, tol, relative=True)):
                        bad[scheme, f"layer {layer} {which.upper()} {quantity}"] = (a, b, f"rel {tol:.3g}")
    return bad, not_checked


# ---- the tests -------------------------------------------------------------------------------------------
@pytest.mark.parametrize("arch", sorted(GOLDEN["tiny"]))
def test_single_forward_logits_equal_the_hook_bit_for_bit(arch):
    bare, logits = tiny_logits(arch)
    golden = GOLDEN["tiny"][arch]
    for part in ("plain", "padded"):  # exact by construction, on any platform
        assert torch.equal(logits[IDENTITY][part], bare[part]), f"{arch} identity ({part}) is not the plain model"
    same_floats = all(digest(bare[part]) == golden[IDENTITY][part] for part in ("plain", "padded"))
    if not (on_golden_platform() or same_floats):
        warnings.warn(
            NotChecked(
                f"{arch}: NOT CHECKED: the plain model's logits differ from the golden platform's ({_platform_note()}); "
                "the golden file holds only digests of logits, which no tolerance can compare: checked the identity "
                "scheme only (test_stored_kv_equals_the_golden checks what this architecture stores)"
            ),
            stacklevel=1,
        )
        return
    for scheme, want in golden.items():
        assert digest(logits[scheme]["plain"]) == want["plain"], f"{arch} {scheme} (unpadded)"
        assert digest(logits[scheme]["padded"]) == want["padded"], f"{arch} {scheme} (left-padded)"


@pytest.mark.parametrize("arch", sorted(KV_GOLDEN["tiny"]))
def test_stored_kv_equals_the_golden(arch):
    bad, not_checked = kv_checks(arch, kv_stats(arch))
    warn_not_checked(f"{arch} stored K/V", not_checked, KV_GOLDEN)
    assert not bad, f"(got, golden, tolerance) where they disagree; {_platform_note(KV_GOLDEN)}: {bad}"


@pytest.mark.slow
def test_embedded_perplexity_kl_top1_equal_the_hook(embedded, tmp_path):
    bad, not_checked = perplexity_checks(perplexity_values(embedded, tmp_path))
    warn_not_checked("embedded perplexity", not_checked)
    assert not bad, f"(got, golden, tolerance) where they disagree; {_platform_note()}: {bad}"


@pytest.mark.slow
def test_embedded_lmeval_logliks_equal_the_hook(embedded, tmp_path):
    bad, not_checked = lmeval_checks(lmeval_logliks(embedded, tmp_path))
    warn_not_checked("embedded lm-eval", not_checked)
    assert not bad, f"(got, golden, tolerance) where they disagree; {_platform_note()}: {bad}"


# ---- the checks can fail: a quantizer that does nothing, off the golden platform --------------------------
def noop_quantize(x, fmt, granularity, *, scale=None, zero=None, valid=None, tensor_scale=None):
    """A quantizer that returns its input: codes = x, every scale 1 (zero points 0), so the values
    attention reads are x itself; shapes as the real quantizer's, so the store runs unchanged."""
    from evalkit.kv.quantize import Quantized, quantize

    real = quantize(x, fmt, granularity, scale=scale, zero=zero, valid=valid, tensor_scale=tensor_scale)
    return Quantized(
        x.float(),
        torch.ones_like(real.scale),
        None if real.zero is None else torch.zeros_like(real.zero),
        real.granularity,
        real.nonfinite,
        real.tensor_scale,
    )


@pytest.fixture
def off_platform(monkeypatch):
    """This machine taken for another than the golden files' (the platform comparison says no)."""
    monkeypatch.setattr(sys.modules[__name__], "same_platform", lambda a, b: False)


@pytest.fixture
def noop(monkeypatch):
    """The no-op quantizer, and a store that keeps its float32 codes as they are (the cache holds
    codes only: attention reads the stored codes decoded, so a no-op must store losslessly too)."""
    from evalkit.integration import stored, stored_blocks, stored_read

    real_decode = stored_read.decode
    for module in (stored, stored_blocks):
        monkeypatch.setattr(module, "quantize", noop_quantize)
        monkeypatch.setattr(module, "encode_quantized", lambda q, fmt: q.codes)
    monkeypatch.setattr(stored_read, "decode", lambda t, fmt: t if t.dtype == torch.float32 else real_decode(t, fmt))
    monkeypatch.setattr(
        stored.StoredTensor,
        "_zero_codes",
        lambda self, b, h, s, d, device: torch.zeros(b, h, s, d, dtype=torch.float32, device=device),
    )


@pytest.mark.parametrize("arch", sorted(KV_GOLDEN["tiny"]))
def test_a_noop_quantizer_fails_the_stored_kv_checks_off_platform(arch, off_platform, noop):
    got = kv_stats(arch)
    assert all(e == 0.0 for row in got.values() for e in row["err_k"] + row["err_v"])  # it really stores its input
    bad, not_checked = kv_checks(arch, got)
    failed = {key[0] for key in bad}
    assert failed == set(KV_GOLDEN["tiny"][arch]), f"passed for a no-op: {set(KV_GOLDEN['tiny'][arch]) - failed}"
    assert not not_checked  # every error norm resolves: its tolerance is ~1e-4 of it


@pytest.mark.parametrize("arch", sorted(KV_GOLDEN["tiny"]))
def test_the_real_quantizer_passes_the_stored_kv_checks_off_platform(arch, off_platform):
    bad, not_checked = kv_checks(arch, kv_stats(arch))
    assert not bad and not not_checked


def test_a_noop_quantizer_fails_or_is_not_checked_in_perplexity_and_lmeval_off_platform(off_platform):
    """A quantizer that does nothing makes every scheme's output the unquantized one, exactly (the
    identity path; test_a_noop_quantizer_fails_the_stored_kv_checks_off_platform runs it for real):
    fed that, every quantized scheme's every perplexity check fails or is listed as not checked, and
    the lm-eval items too; fp8_e4m3/head/dynamic's Δppl (0.020 against 1.44) is among the not checked."""
    base = GOLDEN["perplexity"][IDENTITY]
    noop_ppl = {s: {**base, "kl_lower_bound": 0.0} for s in GOLDEN["perplexity"]}
    bad, not_checked = perplexity_checks(noop_ppl)
    for scheme in GOLDEN["perplexity"]:
        if scheme == IDENTITY:
            continue
        for metric in ("ppl", "ppl_delta", "top1_agreement", "kl_mean"):
            listed = any(item.startswith(f"{scheme} {metric} ") for item in not_checked)
            assert (scheme, metric) in bad or listed, (scheme, metric)
        assert (scheme, "kl_mean") in bad  # KL resolves for every scheme: a no-op never passes it
    assert any(item.startswith("fp8_e4m3/head/dynamic ppl_delta ") for item in not_checked)
    baseline = GOLDEN["lmeval"][IDENTITY]
    bad, not_checked = lmeval_checks({s: dict(baseline) for s in GOLDEN["lmeval"]})
    for scheme, items in GOLDEN["lmeval"].items():
        if scheme != IDENTITY:
            for doc in items:
                listed = any(item.startswith(f"{scheme} items") and f"{doc} (effect" in item for item in not_checked)
                assert (scheme, doc) in bad or listed, (scheme, doc)
