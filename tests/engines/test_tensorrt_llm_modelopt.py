"""The tensorrt-llm profile's ModelOpt 0.47 KV presets: the two FP8 presets as schemes (kv/fp8_cast is scale 1 by
its recipe, use_constant_amax), the rest named with why they are not modelled, each refused in one line."""

from __future__ import annotations

import pytest

from evalkit.cli import main
from evalkit.engines.registry import get_profile
from evalkit.errors import SchemeError

# modelopt_recipes/configs/ptq/presets/kv/*.yaml in the nvidia-modelopt 0.47.0 wheel (there is no none.yaml)
PRESETS = {"fp8", "fp8_affine", "fp8_cast", "nvfp4", "nvfp4_affine", "nvfp4_cast", "nvfp4_rotate"}


def test_every_preset_is_a_row_modelled_or_named_with_why():
    profile = get_profile("tensorrt-llm")
    modelled = {d.name for d in profile.kv_cache_dtypes if d.name.startswith("kv/")}
    named = {name for name, _ in profile.not_modelled if name.startswith("kv/")}
    assert modelled == {"kv/fp8", "kv/fp8_cast"} and modelled | named == {f"kv/{p}" for p in PRESETS}
    assert str(profile.scheme_for("kv/fp8_cast")) == "fp8_e4m3/tensor/unit"  # amax pinned to 448: 448 / 448 = 1


def test_the_cast_preset_takes_no_scales_and_the_others_are_refused_in_one_line(tmp_path):
    profile = get_profile("tensorrt-llm")
    with pytest.raises(SchemeError, match=r"kv/fp8_cast with scale 1.0 only .*fp8_e4m3/tensor/unit"):
        profile.scheme_for("kv/fp8_cast", tmp_path / "scales.safetensors")
    for name in ("kv/fp8_affine", "kv/nvfp4", "kv/nvfp4_cast", "kv/nvfp4_affine", "kv/nvfp4_rotate"):
        with pytest.raises(SchemeError, match=f"kv_cache_dtype {name} is not modelled: ModelOpt's") as info:
            profile.scheme_for(name)
        assert "\n" not in str(info.value)


def test_schemes_lists_them(capsys):
    assert main(["schemes", "--engine-profile", "tensorrt-llm"]) == 0
    out = capsys.readouterr().out
    assert "kv/fp8_cast      fp8_e4m3/tensor/unit" in out and "kv/nvfp4_rotate  not modelled" in out
    assert "use_constant_amax" in out
