"""Engine profiles: engine settings -> the scheme that models them, what each engine refuses, and
applying a profile to a plain emulation scheme (run.py's --engine-profile, a grid's engine_profile:)."""

from __future__ import annotations

import dataclasses
import os
from pathlib import Path

import pytest
import torch

from evalkit.engines import PROFILES, EngineProfile, apply_profile, get_profile
from evalkit.errors import SchemeError
from evalkit.kv.formats import FORMATS
from evalkit.kv.rounding import Rounding
from evalkit.kv.scale_table import load_scale_table
from evalkit.kv.scheme import NAMED_SCHEMES, parse_scheme
from evalkit.models.info import KVLayout

ROOT = Path(__file__).resolve().parents[2]
TENSOR_TABLE = "calibration/smollm2-135m-tensor-amax.safetensors"
HEAD_TABLE = "calibration/smollm2-135m-head-amax.safetensors"
SMOLLM = KVLayout("llama", 30, 3, 64, 64, (), None, 2048)  # what the shipped tables were calibrated on


def one_line_error(fn, *args, **kwargs) -> str:
    with pytest.raises(SchemeError) as err:
        fn(*args, **kwargs)
    message = str(err.value)
    assert "\n" not in message
    return message


# -- the table ------------------------------------------------------------------------------------
def test_registry_and_unknown_names():
    assert set(PROFILES) == {"vllm-cpu", "vllm-cuda", "vllm-rocm", "sglang", "tensorrt-llm"}
    assert get_profile("vllm-cpu") is PROFILES["vllm-cpu"]
    message = one_line_error(get_profile, "vllm")
    assert "unknown engine profile 'vllm'" in message and all(name in message for name in PROFILES)


@pytest.mark.parametrize("name", list(PROFILES))
def test_profiles_are_frozen_data_with_sourced_facts(name):
    p = get_profile(name)
    assert isinstance(p, EngineProfile) and hash(p) == hash(dataclasses.replace(p))
    with pytest.raises(dataclasses.FrozenInstanceError):
        p.name = "other"  # type: ignore[misc]
    assert p.facts and all(f.text and f.source for f in p.facts)
    for d in p.kv_cache_dtypes:
        assert d.format is None or d.format in FORMATS
        # a named scheme, or an engine codec's scheme by its canonical name (vllm-rocm's vllm:octave_*)
        assert d.named is None or d.named in NAMED_SCHEMES or str(parse_scheme(d.named)) == d.named
    assert "auto" in {d.name for d in p.kv_cache_dtypes}
    summary = p.summary()
    assert summary.startswith(f"{name}: ") and summary.count("\n") == len(p.facts) + len(p.attention_paths)


# -- the attention path per GPU generation (vllm-cuda: vLLM 0.33's backend selection) -----------------
@pytest.mark.parametrize(
    "dtype, gpu, backend, attention, approximate",
    [
        ("fp8", "hopper", "FLASH_ATTN (FlashAttention 3)", "fa3", False),
        ("fp8_e4m3", "h200", "FLASH_ATTN (FlashAttention 3)", "fa3", False),
        ("fp8_e4m3", "h100", "FLASH_ATTN (FlashAttention 3)", "fa3", False),
        ("fp8", "b200", "FLASHINFER (trtllm-gen)", "fa3", True),  # Q in FP8 read; P's precision not read
        ("fp8", "a100", "FLASHINFER (FA2 kernels)", "kv", False),
        ("fp8_e4m3", "L40S", "FLASHINFER (FA2 kernels)", "kv", False),
        ("fp8", "blackwell-rtx", "FLASHINFER (FA2 kernels)", "kv", False),
        ("fp8_e5m2", "ampere", "FLASHINFER (FA2 kernels)", "kv", False),
        ("fp8_e5m2", "hopper", "FLASHINFER", "kv", True),  # FlashAttention refuses E5M2; Q at prefill not modeled
    ],
)
def test_vllm_cuda_attention_path_per_gpu_generation(dtype, gpu, backend, attention, approximate):
    path = get_profile("vllm-cuda").attention_path(dtype, gpu)
    assert (path.backend, path.attention.value, path.approximate) == (backend, attention, approximate)
    assert path.facts and all(f.text and f.source for f in path.facts)
    assert approximate == bool(path.approximate and path.unmodeled)
    assert any("vllm/platforms/cuda.py" in f.source for f in path.facts)  # the selection, cited on every path


def test_attention_paths_default_to_hopper_and_name_what_was_not_read():
    from evalkit.engines.attention_paths import GENERATIONS, generation

    cuda = get_profile("vllm-cuda")
    assert cuda.default_gpu == "hopper" and cuda.attention_path("fp8").label == "FA3"
    assert cuda.path_of(parse_scheme("fp8_e4m3/tensor/unit")).attention.value == "fa3"
    assert cuda.path_of(parse_scheme("fp8_e5m2/tensor/unit"), "a100").tag == "K/V"
    assert cuda.path_of(parse_scheme("fp8_e5m2/tensor/unit"), "hopper").tag == "K/V, approx."
    assert cuda.path_of(parse_scheme("auto")) is None and cuda.attention_path("fp8_e5m2", "b200") is None
    # every generation has a path for an E4M3 cache; the profiles of other engines record none
    assert all(cuda.attention_path("fp8_e4m3", g) is not None for g in GENERATIONS)
    assert all(get_profile(n).attention_path("fp8", "hopper") is None for n in PROFILES if n != "vllm-cuda")
    assert generation("GH200").name == "hopper" and generation("sm100").name == "blackwell"
    message = one_line_error(generation, "tpu-v5")
    assert "unknown GPU 'tpu-v5'" in message and "hopper" in message and "h200" in message


@pytest.mark.parametrize(
    "dtype, gpu, expected",
    [
        ("fp8", "h200", "fp8_e4m3/tensor/unit+attn=fa3"),
        ("fp8_e4m3", "b200", "fp8_e4m3/tensor/unit+attn=fa3"),
        ("fp8", "a100", "fp8_e4m3/tensor/unit"),
        ("fp8_e5m2", "hopper", "fp8_e5m2/tensor/unit"),
        ("auto", "hopper", "auto"),
    ],
)
def test_scheme_for_a_gpu_takes_its_attention_path(dtype, gpu, expected):
    scheme = get_profile("vllm-cuda").scheme_for(dtype, gpu=gpu)
    assert str(scheme) == expected
    get_profile("vllm-cuda").check(scheme)


def test_scheme_for_a_gpu_with_scales_and_the_refusals():
    cuda = get_profile("vllm-cuda")
    assert str(cuda.scheme_for("fp8", TENSOR_TABLE, gpu="h100")) == (
        f"fp8_e4m3/tensor/static+scales={TENSOR_TABLE}+attn=fa3"
    )
    assert str(cuda.scheme_for("fp8", HEAD_TABLE, gpu="h100")) == f"fp8_e4m3/head/static+scales={HEAD_TABLE}+attn=fa3"
    assert str(cuda.scheme_for("fp8", gpu="h100", attention="kv")) == "fp8_e4m3/tensor/unit"  # named wins
    message = one_line_error(cuda.scheme_for, "fp8_e5m2", gpu="b200")
    assert "attention path for kv_cache_dtype fp8_e5m2 on b200 was not read" in message
    assert "ampere, ada, hopper, blackwell-rtx" in message and "+attn=kv or +attn=fa3" in message
    assert "records no attention path per GPU" in one_line_error(
        get_profile("sglang").scheme_for, "fp8_e4m3", gpu="h100"
    )
    assert "unknown GPU" in one_line_error(cuda.scheme_for, "fp8", gpu="mi300x")
    # per-head scales need FA3, which A100 does not run
    assert "per-head scales run on its FlashAttention-3 path only" in one_line_error(
        cuda.scheme_for, "fp8", HEAD_TABLE, gpu="a100"
    )


def _cited(source: str):
    """(file, names) for each ``file (Name, Class.method, ...)`` part of a fact's source naming vLLM's code."""
    for part in source.split("; "):
        file, _, names = part.partition(" (")
        if file.startswith("vllm/") and file.endswith(".py"):
            yield file, [n.split()[0] for n in names.rstrip(")").split(", ") if n]


WHEELS = os.environ.get("EVALKIT_VLLM_WHEELS")  # a folder holding the vllm 0.33.0 and 0.32.0 wheels


@pytest.mark.skipif(not WHEELS, reason="set EVALKIT_VLLM_WHEELS to a folder with vLLM's wheels to check the citations")
@pytest.mark.parametrize("version", ["0.33.0", "0.32.0"])
def test_attention_path_citations_name_code_in_the_vllm_wheels(version):
    """Every vLLM file an attention path cites is in the wheel, and every function or class it names is in that file."""
    import zipfile

    (wheel,) = Path(WHEELS).glob(f"vllm-{version}-*.whl")
    cited = 0
    with zipfile.ZipFile(wheel) as zf:
        for path in get_profile("vllm-cuda").attention_paths:
            for fact in path.facts:
                for file, names in _cited(fact.source):
                    text = zf.read(file).decode()
                    for name in names:
                        assert all(part in text for part in name.split(".")), f"{version}: {name} not in {file}"
                        cited += 1
    assert cited >= 20


# -- engine settings -> scheme --------------------------------------------------------------------
@pytest.mark.parametrize(
    "profile, dtype, expected",
    [
        ("vllm-cpu", "auto", "auto"),
        ("vllm-cpu", "fp8", "fp8_e4m3/tensor/unit+recipe=vllm_cpu+rounding=rtz"),
        ("vllm-cpu", "fp8_e4m3", "fp8_e4m3/tensor/unit+recipe=vllm_cpu+rounding=rtz"),
        ("vllm-cpu", "fp8_e5m2", "fp8_e5m2/tensor/unit+recipe=vllm_cpu+rounding=rtz"),
        ("vllm-cuda", "fp8", "fp8_e4m3/tensor/unit"),
        ("vllm-cuda", "fp8_e5m2", "fp8_e5m2/tensor/unit"),
        ("vllm-rocm", "fp8", "fp8_e4m3fnuz/tensor/unit"),  # the 1.0 without scales is not doubled
        ("sglang", "fp8_e4m3", "fp8_e4m3/tensor/unit"),
        ("sglang", "fp4_mx_block16", "sglang_fp4"),
        ("sglang", "bfloat16", "bf16"),
        ("tensorrt-llm", "fp8", "fp8_e4m3/tensor/unit"),
        ("tensorrt-llm", "nvfp4", "nvfp4"),
    ],
)
def test_scheme_for_without_scales(profile, dtype, expected):
    scheme = get_profile(profile).scheme_for(dtype)
    assert str(scheme) == expected
    get_profile(profile).check(scheme)


def test_vllm_cpu_with_checkpoint_scales_keeps_the_table():
    scheme = get_profile("vllm-cpu").scheme_for("fp8_e4m3", TENSOR_TABLE)
    assert str(scheme) == f"fp8_e4m3/tensor/static+recipe=vllm_cpu+scales={TENSOR_TABLE}+rounding=rtz"
    assert scheme.rounding is Rounding.RTZ and scheme.kv_format.rounding is Rounding.RTZ


def test_scheme_for_refusals():
    cpu = get_profile("vllm-cpu")
    assert "fp8_e5m2 with scale 1.0 only" in one_line_error(cpu.scheme_for, "fp8_e5m2", TENSOR_TABLE)
    message = one_line_error(cpu.scheme_for, "int8")
    assert "no kv_cache_dtype 'int8'" in message and "fp8_e4m3" in message and "auto" in message
    assert "per-head" in one_line_error(cpu.scheme_for, "fp8", HEAD_TABLE)
    assert "scales do not apply" in one_line_error(cpu.scheme_for, "auto", TENSOR_TABLE)
    assert "computes its own per-group scales" in one_line_error(
        get_profile("sglang").scheme_for, "fp4_mx_block16", TENSOR_TABLE
    )
    cuda = get_profile("vllm-cuda")
    assert "+attn=fa3" in one_line_error(cuda.scheme_for, "fp8", HEAD_TABLE)
    s = cuda.scheme_for("fp8", HEAD_TABLE, attention="fa3")
    assert str(s) == f"fp8_e4m3/head/static+scales={HEAD_TABLE}+attn=fa3"


def test_sglang_takes_exactly_0_5_23s_dtypes_and_refuses_fp4_e2m1_naming_its_new_name():
    """SGLang 0.5.23's --kv-cache-dtype choices (sglang/srt/arg_groups/fields/model.py), each modelled or named as
    not modelled; fp4_e2m1, which 0.5.23 does not take, is refused in one line naming fp4_mx_block16."""
    sglang = get_profile("sglang")
    released = {"auto", "fp8_e5m2", "fp8_e4m3", "mxfp8", "bf16", "bfloat16", "nvfp4", "fp4_mx_block16"}
    modelled = {d.name for d in sglang.kv_cache_dtypes}
    assert modelled | {n for n, _ in sglang.not_modelled} == released
    assert {n for n, _ in sglang.not_modelled} == {"nvfp4"} and "nvfp4" not in modelled
    message = one_line_error(sglang.scheme_for, "fp4_e2m1")
    assert "SGLang 0.5.23 has no kv_cache_dtype fp4_e2m1" in message and "fp4_mx_block16" in message
    assert "not modelled" in one_line_error(sglang.scheme_for, "nvfp4")
    assert sglang.kv_cache_dtype_of(parse_scheme("sglang_fp4")) == "fp4_mx_block16"
    assert sglang.kv_cache_dtype_of(parse_scheme("sglang:mxfp8")) == "mxfp8"


def test_vllm_rocm_doubles_checkpoint_scales_into_an_fnuz_table(tmp_path):
    rocm = get_profile("vllm-rocm")
    scheme = rocm.scheme_for("fp8", TENSOR_TABLE, out_dir=tmp_path)
    derived = tmp_path / "smollm2-135m-tensor-amax.vllm-rocm.safetensors"
    assert str(scheme) == f"fp8_e4m3fnuz/tensor/static+scales={derived}"
    source, table = load_scale_table(ROOT / TENSOR_TABLE), load_scale_table(derived)
    assert torch.equal(table.k_scale, source.k_scale * 2) and torch.equal(table.v_scale, source.v_scale * 2)
    assert table.meta["format"] == "fp8_e4m3fnuz" and table.meta["derived_from"] == TENSOR_TABLE
    assert table.meta["engine_profile"] == "vllm-rocm" and table.meta["config_hash"] == source.meta["config_hash"]
    # it binds: BoundScheme's format and shape checks accept the derived table
    from evalkit.integration.binding import BoundScheme

    bound = BoundScheme(scheme, SMOLLM)
    assert (
        bound.fmt.name == "fp8_e4m3fnuz"
        and bound.fixed_scale("k", 3, torch.device("cpu")).item() == table.k_scale[3].item()
    )
    # the same call again finds the same table and leaves it alone
    mtime = derived.stat().st_mtime_ns
    assert rocm.scheme_for("fp8", TENSOR_TABLE, out_dir=tmp_path) == scheme and derived.stat().st_mtime_ns == mtime
    # applying the profile to the plain scheme gives the same thing
    plain = parse_scheme(f"fp8_e4m3/tensor/static+scales={TENSOR_TABLE}")
    assert rocm.apply(plain, out_dir=tmp_path) == scheme
    # a table made for fnuz is not a checkpoint's (OCP) scales: no silent second doubling
    assert "calibrated for fp8_e4m3fnuz, not fp8_e4m3" in one_line_error(rocm.apply, scheme, out_dir=tmp_path)


def test_tensorrt_llm_floors_modelopt_scales_at_one(tmp_path):
    trt = get_profile("tensorrt-llm")
    scheme = trt.scheme_for("fp8", TENSOR_TABLE, out_dir=tmp_path)
    table = load_scale_table(scheme.static_path)
    source = load_scale_table(ROOT / TENSOR_TABLE)
    assert torch.equal(table.k_scale, source.k_scale.clamp(min=1.0)) and torch.equal(
        table.v_scale, source.v_scale.clamp(min=1.0)
    )
    assert table.meta["format"] == "fp8_e4m3" and "at least 1" in table.meta["engine_transform"]
    assert scheme.format == "fp8_e4m3" and scheme.rounding is Rounding.RNE


# -- what each engine can run -----------------------------------------------------------------------
@pytest.mark.parametrize(
    "profile, text, fragment",
    [
        ("vllm-cpu", "fp8_e4m3/head/static+scales=h.safetensors+rounding=rtz", "not per head"),
        ("vllm-cpu", "fp8_e4m3/block16/dynamic+rounding=rtz", "not per block16"),
        ("vllm-cpu", "fp8_e4m3/tensor/dynamic+rounding=rtz", "never computes scales from the values"),
        ("vllm-cpu", "nvfp4", "nvfp4 is not one of its KV cache dtypes"),
        ("vllm-cpu", "mxfp4", "fp8_e4m3/tensor/unit|static+recipe=vllm_cpu+rounding=rtz"),
        ("vllm-cpu", "fp4_e2m1/group16/dynamic", "not fp4_e2m1"),
        ("vllm-cpu", "int8/token/dynamic", "not int8"),
        ("vllm-cpu", "int4/group32/dynamic", "it stores K/V as fp8_e4m3 or fp8_e5m2"),
        ("vllm-cpu", "fp8_e4m3/tensor/unit", "it rounds fp8_e4m3 toward zero (after x * float32(1 / scale)"),
        ("vllm-cpu", "fp8_e4m3/tensor/unit+rounding=rna", "use fp8_e4m3/tensor/unit+recipe=vllm_cpu+rounding=rtz"),
        # plain truncation is not the whole store: the recipe is (x * float32(1/scale), +0 for zero)
        ("vllm-cpu", "fp8_e4m3/tensor/unit+rounding=rtz", "use fp8_e4m3/tensor/unit+recipe=vllm_cpu+rounding=rtz"),
        ("vllm-cuda", "fp8_e4m3/tensor/unit+recipe=vllm_cpu+rounding=rtz", "drop +rounding= and +recipe="),
        ("vllm-cpu", "fp8_e5m2/tensor/static+scales=x.safetensors+rounding=rtz", "scale 1.0 only"),
        ("vllm-cpu", "fp8_e4m3/tensor/unit+rounding=rtz+attn=fa3", "attention precision fa3"),
        ("vllm-cpu", "fp8_e4m3/group128/dynamic+rounding=rtz+rope=bf16", "MLA"),
        ("vllm-cpu", "fp8_e4m3/group32/dynamic+scale_dtype=e8m0+rounding=rtz", "float32 per tensor"),
        ("vllm-cuda", "fp8_e4m3/tensor/unit+rounding=rtz", "to nearest, ties to even: drop +rounding="),
        ("vllm-cuda", "fp8_e4m3/head/static+scales=h.safetensors", "FlashAttention-3 path only"),
        ("vllm-cuda", "fp8_e4m3/head/unit+attn=fa3", "not per head"),
        ("vllm-cuda", "fp8_e5m2/tensor/unit+attn=fa3", "E4M3 only"),
        ("vllm-cuda", "nvfp4", "not one of its KV cache dtypes"),
        ("vllm-rocm", "fp8_e4m3/tensor/unit", "stored as fp8_e4m3fnuz: apply the profile"),
        ("sglang", "fp8_e4m3/tensor/unit+skip=0", "drop +skip="),
        ("sglang", "fp8_e4m3/tensor/dynamic", "never computes scales"),
        (
            "sglang",
            "fp4_e2m1/group16/dynamic+scale_dtype=e8m0+recipe=sglang",
            "not fp4_e2m1; it runs fp8_e4m3/tensor/unit|static, fp8_e5m2/tensor/unit|static, sglang_fp4",
        ),
        ("tensorrt-llm", "int8/tensor/unit", "not int8"),
        ("tensorrt-llm", "mxfp8_e4m3", "not one of its KV cache dtypes"),
    ],
)
def test_check_refuses_in_one_line_naming_what_is_supported(profile, text, fragment):
    message = one_line_error(get_profile(profile).check, parse_scheme(text))
    assert fragment in message and message.startswith(f"{profile} cannot run ")


@pytest.mark.parametrize(
    "profile, text",
    [
        ("vllm-cpu", "auto"),
        ("vllm-cpu", "fp8_e4m3/tensor/unit+recipe=vllm_cpu+rounding=rtz"),
        ("vllm-cpu", "fp8_e4m3/tensor/static+recipe=vllm_cpu+scales=s.safetensors+rounding=rtz+skip=0,5"),
        ("vllm-cpu", "fp8_e5m2/tensor/unit+recipe=vllm_cpu+rounding=rtz+skip=sliding"),
        ("vllm-cuda", "fp8_e4m3/tensor/static+scales=s.safetensors+attn=fa3"),
        ("vllm-cuda", "fp8_e4m3/head/static+scales=h.safetensors+attn=fa3"),
        ("vllm-rocm", "fp8_e4m3fnuz/tensor/static+scales=s.safetensors"),
        ("sglang", "sglang_fp4"),
        ("sglang", "fp8_e5m2/tensor/static+scales=s.safetensors"),
        ("tensorrt-llm", "nvfp4"),
    ],
)
def test_check_accepts_what_the_engine_runs(profile, text):
    get_profile(profile).check(parse_scheme(text))


def test_check_with_a_layout_adds_the_head_dim_requirement():
    cpu = get_profile("vllm-cpu")
    scheme = parse_scheme("fp8_e4m3/tensor/unit+recipe=vllm_cpu+rounding=rtz")
    cpu.check(scheme, SMOLLM)
    odd = KVLayout("llama", 2, 2, 80, 80, (), None, 2048)
    assert "head_dim divisible by 32" in one_line_error(cpu.check, scheme, odd)
    get_profile("vllm-cuda").check(parse_scheme("fp8_e4m3/tensor/unit"), odd)
    cpu.check(parse_scheme("auto"), odd)  # the unquantized baseline runs anywhere


# -- emulation scheme -> the engine's kernels --------------------------------------------------------------
@pytest.mark.parametrize(
    "profile, text, expected",
    [
        ("vllm-cpu", "fp8_e4m3/tensor/unit", "fp8_e4m3/tensor/unit+recipe=vllm_cpu+rounding=rtz"),
        ("vllm-cpu", "fp8_e4m3/tensor/unit+rounding=rna", "fp8_e4m3/tensor/unit+recipe=vllm_cpu+rounding=rtz"),
        (
            "vllm-cpu",
            f"fp8_e4m3/tensor/static+scales={TENSOR_TABLE}+skip=0",
            f"fp8_e4m3/tensor/static+recipe=vllm_cpu+scales={TENSOR_TABLE}+rounding=rtz+skip=0",
        ),
        ("vllm-cpu", "fp8_e5m2/tensor/unit", "fp8_e5m2/tensor/unit+recipe=vllm_cpu+rounding=rtz"),
        ("vllm-cpu", "auto", "auto"),
        ("vllm-cuda", "fp8_e4m3/tensor/unit+rounding=rtz", "fp8_e4m3/tensor/unit"),
        (
            "vllm-cuda",
            f"fp8_e4m3/head/static+scales={HEAD_TABLE}+attn=fa3",
            f"fp8_e4m3/head/static+scales={HEAD_TABLE}+attn=fa3",
        ),
        ("vllm-rocm", "fp8_e4m3/tensor/unit", "fp8_e4m3fnuz/tensor/unit"),
        ("sglang", "sglang_fp4", "sglang_fp4"),
        ("sglang", "fp8_e4m3/tensor/unit", "fp8_e4m3/tensor/unit"),
        ("tensorrt-llm", "nvfp4+skip=0", None),  # skip is refused there
    ],
)
def test_apply_sets_the_engines_rounding_and_format(profile, text, expected):
    p = get_profile(profile)
    if expected is None:
        one_line_error(p.apply, parse_scheme(text))
        return
    out = p.apply(parse_scheme(text))
    assert str(out) == expected
    p.check(out)
    assert apply_profile(text, profile) == out and apply_profile(text, None) == parse_scheme(text)


@pytest.mark.parametrize(
    "text",
    [
        "fp8_e4m3/head/dynamic",
        "fp8_e4m3/block16/dynamic",
        "fp8_e4m3/tensor/dynamic",
        "nvfp4",
        "int8/token/dynamic",
        "fp8_e4m3/head/static+scales=" + HEAD_TABLE,
    ],
)
def test_apply_refuses_what_vllm_cpu_cannot_run(text):
    message = one_line_error(get_profile("vllm-cpu").apply, parse_scheme(text))
    assert message.startswith("vllm-cpu") or "vllm-cpu" in message


def test_applied_rounding_reaches_the_stored_codes():
    """The profile's rounding is the quantizer's: vllm-cpu's unit-scale E4M3 codes are truncations."""
    from evalkit.kv.quantize import quantize

    scheme = get_profile("vllm-cpu").apply(parse_scheme("fp8_e4m3/tensor/unit"))
    x = torch.tensor([1.0625, 1.1875, -1.0625, 1.09375, 500.0]).reshape(1, 1, 1, 5)
    q = quantize(x, scheme.kv_format, scheme.granularity, scale=torch.ones(1, 1, 1, 1))
    assert q.codes.flatten().tolist() == [1.0, 1.125, -1.0, 1.0, 448.0]


# -- the command line and grids ---------------------------------------------------------------------------
GRID = """\
name: g
models: [tiny]
schemes:
  - auto
  - fp8_e4m3/tensor/unit
  - fp8_e5m2/tensor/unit
engine_profile: {profile}
evals:
  toy: {{max_tokens: 8}}
"""


def test_grid_engine_profile_key(tmp_path, toy_eval):
    from evalkit.sweep.grid import GridError, parse_grid, with_engine_profile

    path = tmp_path / "g.yaml"
    path.write_text(GRID.format(profile="vllm-cpu"))
    grid = parse_grid(path)
    assert [r.scheme for r in grid.runs] == [
        "auto",
        "fp8_e4m3/tensor/unit+recipe=vllm_cpu+rounding=rtz",
        "fp8_e5m2/tensor/unit+recipe=vllm_cpu+rounding=rtz",
    ]
    plain = parse_grid(path, GRID.format(profile="vllm-cpu").replace("engine_profile: vllm-cpu\n", ""))
    assert with_engine_profile(plain, "vllm-cpu").runs == grid.runs
    assert {r.run_id for r in plain.runs} != {r.run_id for r in grid.runs}
    with pytest.raises(GridError, match=r"g\.yaml:7: engine_profile: unknown engine profile 'nope'"):
        parse_grid(path, GRID.format(profile="nope"))
    bad = GRID.format(profile="vllm-cpu").replace(
        "  - fp8_e5m2/tensor/unit\n", "  - fp8_e4m3/head/dynamic\n  - nvfp4\n"
    )
    with pytest.raises(GridError) as err:
        parse_grid(path, bad)
    assert [p.split("g.yaml")[1].split(" vllm-cpu cannot run ")[0] for p in err.value.problems] == [
        ":6: schemes[2]:",
        ":7: schemes[3]:",
    ]  # each at its own entry's line


def test_run_engine_profile_refuses_before_loading_anything(capsys):
    from evalkit.cli import main

    assert main(["run", "--engine-profile", "vllm-cpu", "--schemes", "fp8_e4m3/head/dynamic"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "vllm-cpu cannot run fp8_e4m3/head/dynamic" in err[0]
    assert main(["run", "--engine-profile", "nope", "--schemes", "fp8_e4m3/tensor/unit"]) == 2
    assert "unknown engine profile 'nope'" in capsys.readouterr().err
