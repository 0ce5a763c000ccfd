"""The golden computations of ``tests/integration/test_storage_golden.py``, and how far their results move when
the model's floats move by a rounding-sized amount (the "float spread" the golden tests allow off
the platform that captured the golden numbers).

Another processor rounds the same model's floats differently (other kernels, other summation
orders: :mod:`evalkit.runtime.numerics`), and a quantized forward amplifies that: a tiny change in one K
value moves it across a rounding boundary now and then, the flipped code changes the next layers
by far more. Measuring the spread honestly: run the very computations the golden tests run, with
every weight of the model multiplied by ``1 + eps * N(0, 1)`` (seeded; ``eps = 1e-6`` moves the
unquantized float32 outputs at the 1e-6 level, a float-rounding-sized change), for a few seeds,
and take the largest deviation from the unperturbed result per quantity and scheme.

Re-measure (~25 min on 2 cores; prints the max deviations as the test module's tables, and this
machine's deviation from the golden file against them)::

    python -m tests.float_spread --eps 1e-6 --seeds 0 1 2 3 4 5 6 7 [--parts tiny,kv,perplexity,lmeval] [--json out.json]
    python -m tests.float_spread --quick        # tiny models only (logits, stored K/V), 2 seeds: what CI runs
    python -m tests.float_spread --write-kv-golden --parts kv --seeds 0 1 2 3 4 5 6 7   # re-capture golden_storage_v1.json

The ``kv`` part measures what the storage cache *stores* (:func:`kv_stats`: per-layer K/V error
norms, scale sums, layer 0's codes), the quantities whose float spread is small against the effect
of quantization, so that the golden tests can check them on any platform.

A script rather than a test: it measures, it checks nothing.
"""

from __future__ import annotations

import argparse
import contextlib
import hashlib
import json
import math
import tempfile
import time
from pathlib import Path

import torch

from evalkit import quantized_kv

from tests.tiny_models import tiny_model

GOLDEN = json.loads((Path(__file__).parent / "golden" / "golden_hook_v1.json").read_text())
PPL_PARAMS = {"window": 128, "stride": 128, "max_windows": 3, "bootstrap_samples": 200}
LMEVAL_PARAMS = {"tasks": ["evalkit_mmlu4"], "limit": 4, "bootstrap_iters": 0}
LMEVAL_TASK = "evalkit_mmlu4"
N_SCORED = 381  # tokens the perplexity protocol scores: 3 windows x 127 (top-1 agreement moves in steps of 1/381)


# ---- the golden computations ------------------------------------------------------------------


def digest(t: torch.Tensor) -> str:
    """What the golden file holds for logits: SHA-256 of their float32 bytes."""
    return hashlib.sha256(t.detach().float().contiguous().numpy().tobytes()).hexdigest()


def inputs():
    g = torch.Generator().manual_seed(1)
    ids = torch.randint(3, 128, (2, 40), generator=g)
    mask = torch.ones_like(ids)
    mask[1, :7] = 0
    return ids, mask


@contextlib.contextmanager
def perturbed(model, eps: float, seed: int):
    """Every floating parameter multiplied by ``1 + eps * N(0, 1)`` (seeded) inside the block,
    restored bit for bit on exit. ``eps == 0`` leaves the model alone."""
    if not eps:
        yield model
        return
    g = torch.Generator().manual_seed(seed)
    saved = []
    with torch.no_grad():
        for p in model.parameters():  # tied weights appear once
            if p.is_floating_point():
                saved.append((p, p.detach().clone()))
                noise = torch.randn(p.shape, generator=g, dtype=torch.float64)
                p.copy_((p.double() * (1 + eps * noise)).to(p.dtype))
    try:
        yield model
    finally:
        with torch.no_grad():
            for p, original in saved:
                p.copy_(original)


def tiny_logits(arch: str, model=None) -> tuple[dict[str, torch.Tensor], dict[str, dict[str, torch.Tensor]]]:
    """(bare, {scheme: logits}) for every scheme the golden file holds for ``arch``, each a dict of
    "plain" (the unpadded batch's logits) and "padded" (the left-padded batch's real positions);
    ``bare`` is the same two forwards of the model without evalkit."""
    model = tiny_model(arch) if model is None else model
    ids, mask = inputs()

    def forwards():
        return {"plain": model(ids).logits, "padded": model(ids, attention_mask=mask).logits[mask.bool()]}

    with torch.inference_mode():
        bare = forwards()
    out = {}
    for scheme in GOLDEN["tiny"][arch]:
        with torch.inference_mode(), quantized_kv(model, scheme):
            out[scheme] = forwards()
    return bare, out


KV_GOLDEN_PATH = Path(__file__).parent / "golden" / "golden_storage_v1.json"


@contextlib.contextmanager
def recorded_appends():
    """Inside the block, every store's write also records the K/V it was given (what ``cache.update``
    received), keyed by the store's id: the raw side of an error norm. Both write paths (a store's own
    ``append`` and ``append_pair`` for K and V together) pass each side through ``_arrival``."""
    from evalkit.integration import stored

    seen: dict[int, list[torch.Tensor]] = {}
    original = stored.StoredTensor._arrival

    def arrival(self, x, padding=None):
        seen.setdefault(id(self), []).append(x.detach().clone())
        return original(self, x, padding)

    stored.StoredTensor._arrival = arrival
    try:
        yield seen
    finally:
        stored.StoredTensor._arrival = original


def _norm(x: torch.Tensor) -> float:
    """The 2-norm of ``x`` in float64 with its sum of squares correctly rounded (``math.fsum``): the same
    float whatever the tensor's memory layout or the reduction kernel's order (``Tensor.norm`` sums in
    an order that moves with both, by an ulp)."""
    return math.sqrt(math.fsum((x.double() ** 2).flatten().tolist()))


def _rel_norm(a: torch.Tensor, ref: torch.Tensor) -> float:
    den = _norm(ref)
    err = _norm(a.double() - ref.double())
    return err / den if den else err


def kv_stats(arch: str, model=None) -> dict[str, dict]:
    """What each quantized scheme of the golden file's ``arch`` *stores* in one unpadded forward of
    the tiny model: per layer and for K and V, the relative error norm ||stored - given|| / ||given||
    (float64; the values attention reads against what ``update`` received), the sum of the stored
    scales (dynamic scales only), and layer 0's code bytes and given K/V as SHA-256 digests. These move
    little with the platform's float rounding (an error norm over thousands of values barely notices
    a few flipped codes) but a great deal with the quantizer: a quantizer that stores its input has
    error 0."""
    from evalkit.integration.hf_compat import output_cache

    model = tiny_model(arch) if model is None else model
    ids, _ = inputs()
    out = {}
    for scheme in GOLDEN["tiny"][arch]:
        if scheme == "auto":
            continue
        with torch.inference_mode(), quantized_kv(model, scheme), recorded_appends() as seen:
            cache = output_cache(model(ids, use_cache=True))
        row = {"err_k": [], "err_v": [], "scale_k": [], "scale_v": []}
        for layer in cache.storage_layers():
            for which, st in (("k", layer.k), ("v", layer.v)):
                given = torch.cat(seen[id(st)], dim=2)
                given = given[:, :, given.shape[2] - st.values.shape[2] :]  # sliding windows keep the last tokens
                row[f"err_{which}"].append(_rel_norm(st.values, given) if st.quantized else 0.0)
                scale = st.scale if st.quantized and st.fixed is None else None
                row[f"scale_{which}"].append(None if scale is None else float(scale.double().sum()))
                if layer.layer_idx == 0:
                    row[f"raw0_{which}"] = digest(given)
                    row[f"codes0_{which}"] = (
                        hashlib.sha256(st.codes.contiguous().view(torch.uint8).numpy().tobytes()).hexdigest()
                        if st.quantized
                        else None
                    )
        out[scheme] = row
    return out


def kv_deviation(got: dict, ref: dict) -> dict[str, float]:
    """Largest relative change over the layers of the error norms and of the scale sums."""

    def rel(a, b):
        return abs(a - b) / abs(b) if b else abs(a)

    return {
        "err": max(rel(g, r) for w in "kv" for g, r in zip(got[f"err_{w}"], ref[f"err_{w}"])),
        "scale": max(
            [rel(g, r) for w in "kv" for g, r in zip(got[f"scale_{w}"], ref[f"scale_{w}"]) if r is not None],
            default=0.0,
        ),
    }


def write_kv_golden(path: Path = KV_GOLDEN_PATH) -> dict:
    """Capture :func:`kv_stats` for every architecture of the golden file, with this platform's record."""
    import subprocess

    from evalkit.runtime.numerics import platform_record

    try:
        commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True).stdout.strip()
    except OSError:
        commit = "?"
    data = {
        "made_by": f"tests/float_spread.py --write-kv-golden at evalkit {commit or '?'}",
        "platform": platform_record(),
        "tiny": {arch: kv_stats(arch) for arch in sorted(GOLDEN["tiny"])},
    }
    path.write_text(json.dumps(data, indent=1, sort_keys=True) + "\n")
    return data


def perplexity_values(lm, workdir: Path) -> dict[str, dict[str, float]]:
    """{scheme: {metric: value}} of the golden file's perplexity schemes (the unlabelled rows, plus
    ``kl_lower_bound`` from the KL row's info). The baseline is computed afresh from ``lm``."""
    from evalkit.evals.perplexity.evaluation import PerplexityEval
    from evalkit.kv.scheme import parse_scheme

    ev = PerplexityEval(dict(PPL_PARAMS))
    ev.prepare(lm, Path(workdir))
    out = {}
    for scheme in GOLDEN["perplexity"]:
        rows = {r.metric: r for r in ev.evaluate(lm, parse_scheme(scheme)) if not r.labels}
        out[scheme] = {k: rows[k].value for k in GOLDEN["perplexity"][scheme]}
        out[scheme]["kl_lower_bound"] = rows["kl_mean"].info["kl_lower_bound"]
    return out


def lmeval_logliks(lm, workdir: Path) -> dict[str, dict[str, float]]:
    """{scheme: {doc_id: gold log-likelihood}}; "auto" is the eval's own unquantized baseline."""
    from evalkit.evals.lmeval.evaluation import LmEvalEval
    from evalkit.evals.lmeval.items import items_from_results
    from evalkit.kv.scheme import parse_scheme

    ev = LmEvalEval(dict(LMEVAL_PARAMS))
    ev.prepare(lm, Path(workdir))
    out = {"auto": {str(i["doc_id"]): i["gold_loglik"] for i in ev.baseline_items[LMEVAL_TASK]}}
    for scheme in GOLDEN["lmeval"]:
        if scheme == "auto":
            continue
        items = items_from_results(ev._run(lm, parse_scheme(scheme)))[LMEVAL_TASK]
        out[scheme] = {str(i["doc_id"]): i["gold_loglik"] for i in items}
    return out


# ---- deviations -------------------------------------------------------------------------------


def logits_deviation(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> float:
    """Largest absolute logit difference over the unpadded and the left-padded forward."""
    return max(float((a[k].double() - b[k].double()).abs().max()) for k in ("plain", "padded"))


def perplexity_deviation(got: dict[str, float], ref: dict[str, float]) -> dict[str, float]:
    """Per metric: relative for ppl and KL, absolute for ppl_delta and top-1 agreement."""

    def rel(k):
        return abs(got[k] - ref[k]) / abs(ref[k]) if ref[k] else abs(got[k])

    return {
        "ppl": rel("ppl"),
        "kl_mean": rel("kl_mean"),
        "ppl_delta": abs(got["ppl_delta"] - ref["ppl_delta"]),
        "top1_agreement": abs(got["top1_agreement"] - ref["top1_agreement"]),
    }


def loglik_deviation(got: dict[str, float], ref: dict[str, float], relative: bool = False) -> float:
    """Largest difference over the items (relative to |ref| for the unquantized baseline)."""
    assert set(got) == set(ref)
    return max(abs(got[d] - ref[d]) / (abs(ref[d]) if relative else 1.0) for d in ref)


# ---- the measurement --------------------------------------------------------------------------


def _fold(table: dict, key: str, values: dict[str, float]) -> None:
    slot = table.setdefault(key, {})
    for k, v in values.items():
        slot[k] = max(slot.get(k, 0.0), v)


def measure(eps: float = 1e-6, seeds=(0, 1, 2), parts=("tiny", "perplexity", "lmeval"), lm=None, log=print) -> dict:
    """Max deviation per quantity under ``eps`` weight noise over ``seeds``, from this machine's
    unperturbed result: {"tiny": {arch: {scheme: max |logit diff|}}, "perplexity": {scheme: {metric:
    max dev}}, "lmeval": {scheme: max |loglik diff|}} (bf16 log-likelihoods relative); "samples" holds
    every seed's deviations, "golden_deviation" the unperturbed result's deviation from the golden file."""
    table: dict = {"eps": eps, "seeds": list(seeds), "samples": {}, "golden_deviation": {}}
    samples, golden = table["samples"], table["golden_deviation"]
    if "tiny" in parts:
        tiny = table["tiny"] = {}
        for arch in sorted(GOLDEN["tiny"]):
            model = tiny_model(arch)
            ref_bare, ref = tiny_logits(arch, model)
            for seed in seeds:
                with perturbed(model, eps, seed):
                    got_bare, got = tiny_logits(arch, model)
                dev = {s: logits_deviation(got[s], ref[s]) for s in ref}
                dev["unquantized"] = logits_deviation(got_bare, ref_bare)
                _fold(tiny, arch, dev)
                samples.setdefault("tiny", {}).setdefault(arch, []).append(dev)
            log(f"tiny {arch}: {json.dumps({s: f'{v:.2e}' for s, v in tiny[arch].items()})}")
    if "kv" in parts:
        kv = table["kv"] = {}
        for arch in sorted(GOLDEN["tiny"]):
            model = tiny_model(arch)
            ref = kv_stats(arch, model)
            for seed in seeds:
                with perturbed(model, eps, seed):
                    got = kv_stats(arch, model)
                for scheme in ref:
                    _fold(kv.setdefault(arch, {}), scheme, {})
                    slot = kv[arch][scheme]
                    for k, v in kv_deviation(got[scheme], ref[scheme]).items():
                        slot[k] = max(slot.get(k, 0.0), v)
                samples.setdefault("kv", {}).setdefault(arch, []).append({s: kv_deviation(got[s], ref[s]) for s in ref})
            log(f"kv {arch}: max relative change of error norms {max(v['err'] for v in kv[arch].values()):.2e}")
    if lm is None and ("perplexity" in parts or "lmeval" in parts):
        from evalkit.models.loading import load_model

        lm = load_model("embedded")
    with tempfile.TemporaryDirectory() as tmp:
        if "perplexity" in parts:
            ppl = table["perplexity"] = {}
            ref = perplexity_values(lm, Path(tmp) / "ref")
            golden["perplexity"] = {s: perplexity_deviation(ref[s], want) for s, want in GOLDEN["perplexity"].items()}
            golden["kl_lower_bound_over_golden_kl"] = {
                s: ref[s]["kl_lower_bound"] / want["kl_mean"]
                for s, want in GOLDEN["perplexity"].items()
                if want["kl_mean"]
            }
            for seed in seeds:
                t = time.time()
                with perturbed(lm.model, eps, seed):
                    got = perplexity_values(lm, Path(tmp) / f"ppl{seed}")
                dev = {s: perplexity_deviation(got[s], ref[s]) for s in ref}
                for s in ref:
                    _fold(ppl, s, dev[s])
                samples.setdefault("perplexity", []).append(dev)
                log(f"perplexity seed {seed}: {time.time() - t:.0f} s")
            for s, v in ppl.items():
                log(f"perplexity {s}: {json.dumps({k: f'{x:.2e}' for k, x in v.items()})}")
        if "lmeval" in parts:
            lmev = table["lmeval"] = {}
            ref = lmeval_logliks(lm, Path(tmp) / "ref")
            golden["lmeval"] = {
                s: loglik_deviation(ref[s], want, relative=s == "auto") for s, want in GOLDEN["lmeval"].items()
            }
            for seed in seeds:
                t = time.time()
                with perturbed(lm.model, eps, seed):
                    got = lmeval_logliks(lm, Path(tmp) / f"lmeval{seed}")
                dev = {s: loglik_deviation(got[s], ref[s], relative=s == "auto") for s in ref}
                _fold(table, "lmeval", dev)
                samples.setdefault("lmeval", []).append(dev)
                log(f"lmeval seed {seed}: {time.time() - t:.0f} s")
            log(f"lmeval: {json.dumps({s: f'{v:.2e}' for s, v in lmev.items()})}")
    return table


def _up2(x: float) -> float:
    """``x`` rounded up to two significant digits."""
    if x <= 0:
        return 0.0
    e = math.floor(math.log10(x)) - 1
    return float(f"{math.ceil(x / 10**e - 1e-9) * 10**e:.1e}")


def print_tables(table: dict) -> None:
    """The measured maxima as the spread tables of ``tests/integration/test_storage_golden.py`` (to paste), and
    this machine's deviation from the golden file against ``SAFETY`` x the committed tables."""
    from tests.integration import test_storage_golden as t

    ppl = {s: v for s, v in table.get("perplexity", {}).items() if s != "auto"}
    out = {
        "PPL_SPREAD": {s: _up2(v["ppl"]) for s, v in ppl.items()},
        "PPL_DELTA_SPREAD": {s: _up2(v["ppl_delta"]) for s, v in ppl.items()},
        "KL_SPREAD": {s: _up2(v["kl_mean"]) for s, v in ppl.items()},
        "TOP1_SPREAD": {s: f"{round(v['top1_agreement'] * N_SCORED)} / N_SCORED" for s, v in ppl.items()},
        "LOGLIK_SPREAD": {s: _up2(v) for s, v in table.get("lmeval", {}).items() if s != "auto"},
    }
    kv: dict = {}
    for per_scheme in table.get("kv", {}).values():
        for s, v in per_scheme.items():
            for k in ("err", "scale"):
                kv.setdefault(k, {})[s] = max(kv.get(k, {}).get(s, 0.0), v[k])
    out["KV_ERR_SPREAD"] = {s: _up2(v) for s, v in kv.get("err", {}).items()}
    out["KV_SCALE_SPREAD"] = {s: _up2(v) for s, v in kv.get("scale", {}).items()}
    for name, d in out.items():
        if d:
            print(f"{name} = {{")
            print("\n".join(f"    {s!r}: {v}," for s, v in d.items()))
            print("}")
    for s, v in table.get("perplexity", {}).items():
        if s == "auto":
            print(f"unquantized ppl: max relative deviation {v['ppl']:.1e} (BASELINE_REL {t.BASELINE_REL:.0e})")
    if "auto" in table.get("lmeval", {}):
        print(
            f"unquantized log-likelihoods: max relative deviation {table['lmeval']['auto']:.1e} (BASELINE_REL {t.BASELINE_REL:.0e})"
        )
    gold = table.get("golden_deviation", {})
    committed = {
        "ppl": t.PPL_SPREAD,
        "ppl_delta": t.PPL_DELTA_SPREAD,
        "kl_mean": t.KL_SPREAD,
        "top1_agreement": t.TOP1_SPREAD,
    }
    for s, dev in gold.get("perplexity", {}).items():
        if s in t.PPL_SPREAD:
            print(
                f"here vs golden, {s}: "
                + ", ".join(
                    f"{k} {dev[k]:.2e} ({dev[k] / committed[k][s]:.2f} x spread, limit {t.SAFETY})" for k in committed
                )
            )
    for s, dev in gold.get("lmeval", {}).items():
        if s in t.LOGLIK_SPREAD:
            print(f"here vs golden, lmeval {s}: {dev:.2e} ({dev / t.LOGLIK_SPREAD[s]:.2f} x spread, limit {t.SAFETY})")


def main(argv=None) -> None:
    from evalkit.runtime import numerics

    numerics.configure()  # before the first matrix product, as the tests' conftest does
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--eps", type=float, default=1e-6)
    p.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    p.add_argument("--parts", default="tiny,perplexity,lmeval")
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--json", type=Path, help="also write the table here")
    p.add_argument(
        "--quick",
        action="store_true",
        help="the tiny-model parts only (logits and stored K/V), seeds 0 1: a minute or two on 2 cores (CI runs it)",
    )
    p.add_argument(
        "--write-kv-golden",
        action="store_true",
        help=f"capture the stored-K/V golden file ({KV_GOLDEN_PATH.name}) on this platform, then measure as asked",
    )
    args = p.parse_args(argv)
    torch.set_num_threads(args.threads)
    if args.quick:
        args.parts, args.seeds = "tiny,kv", [0, 1]
    parts = tuple(args.parts.split(","))
    unknown = set(parts) - {"tiny", "kv", "perplexity", "lmeval"}
    if unknown:
        raise SystemExit(
            f"--parts {args.parts}: unknown part(s) {', '.join(sorted(unknown))}; use tiny,kv,perplexity,lmeval"
        )
    print("platform:", json.dumps(numerics.platform_record()))
    if args.write_kv_golden:
        write_kv_golden()
        print(f"wrote {KV_GOLDEN_PATH}")
    table = measure(args.eps, args.seeds, parts)
    if args.json:
        args.json.write_text(json.dumps(table, indent=1))
    print("max deviations:", json.dumps({k: v for k, v in table.items() if k != "samples"}, indent=1))
    print_tables(table)
    if "tiny" in parts:  # a perturbation that moved nothing would make every spread (and tolerance) 0
        moved = min(v["unquantized"] for v in table["tiny"].values())
        if not 0 < moved < 1e-3:
            raise SystemExit(
                f"the weight noise moved the unquantized logits by {moved:.1e}: expected a rounding-sized move"
            )


if __name__ == "__main__":
    main()
