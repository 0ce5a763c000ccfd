"""What vLLM's Triton KV-store checks share: loading a kernel file with the real Triton, the seeded K/V
they write, the record of one check and the classes of differing FP8 codes.

On a CPU platform vLLM imports a placeholder instead of Triton (``vllm/triton_utils/importing.py``:
"Triton is installed, but doesn't include CPU backend"), so a kernel module as vLLM imports it holds
no kernel. :func:`load_with_triton` loads the kernel *file* again as a private module (its own name, so
vLLM's module is untouched) while ``vllm.triton_utils`` resolves, for that one execution only, to a
namespace holding the real ``triton`` and ``triton.language``; the installed package is not edited,
its code is not copied, and ``sys.modules`` is restored before it returns. On ``cuda`` it is vLLM's own
module, imported.

The checks: per-token-head (:mod:`evalkit.engines.vllm.triton_store`, which also runs them all), the
rotation dtypes (:mod:`evalkit.engines.vllm.triton_rotations`) and DeepSeek's MLA writer
(:mod:`evalkit.engines.vllm.triton_ds_mla`).
"""

from __future__ import annotations

import contextlib
import importlib
import importlib.util
import os
import sys
import types
from dataclasses import dataclass, field
from pathlib import Path

import torch

from evalkit.errors import EngineUnavailableError

SHAPE = (256, 2, 64)  # tokens, kv_heads, head_size: 32,768 values each for K and V
BLOCK = 16
STDS = (1e-3, 1.0, 30.0)
FP8_CLASSES = {
    "carry_lost": "y rounds up to a power of two 2**e (RNE); the interpreter stores 2**(e-1): the mantissa's "
    "rounding carry does not reach the exponent (the interpreter's own cast: PTX cvt.rn rounds to nearest even, "
    "carry included)",
    "one_code_toward_zero": "the interpreter's code is the neighbour toward zero of the RNE code",
    "one_code_away_from_zero": "the interpreter's code is the neighbour away from zero of the RNE code",
    "tie_to_odd": "y lies exactly halfway between two codes; RNE takes the even one, the interpreter the odd one",
    "min_subnormal_lost": "y rounds up to the smallest E4M3 subnormal +-2**-9 (RNE); the interpreter stores +-0: the "
    "same lost rounding carry, at the bottom of the range (unscaled keys: turboquant_k8v4)",
    "other": "any other difference",
}


def _vllm_root() -> Path:
    spec = importlib.util.find_spec("vllm")
    if spec is None or spec.origin is None:
        raise EngineUnavailableError("vLLM is not installed: the Triton kernel check reads vLLM's kernel files")
    return Path(spec.origin).parent.parent


@contextlib.contextmanager
def _real_triton_utils():
    """``vllm.triton_utils`` as the real Triton, for the duration of one module execution."""
    try:
        import triton
        import triton.language as tl
    except ImportError as exc:
        raise EngineUnavailableError(f"the triton package is not importable ({exc}): pip install triton") from None
    import vllm.triton_utils as placeholder

    shim = types.ModuleType("vllm.triton_utils")
    for name in getattr(placeholder, "__all__", ()):
        setattr(shim, name, getattr(placeholder, name))
    shim.triton, shim.tl, shim.HAS_TRITON = triton, tl, True
    saved = sys.modules["vllm.triton_utils"]
    sys.modules["vllm.triton_utils"] = shim
    try:
        yield
    finally:
        sys.modules["vllm.triton_utils"] = saved


def check_interpreting() -> None:
    """Triton reads ``TRITON_INTERPRET`` when it is first imported (vLLM imports it at start-up), so the
    variable must be set for the whole process: :func:`conformance` starts one with it."""
    if os.environ.get("TRITON_INTERPRET") != "1":
        raise EngineUnavailableError(
            "Triton's interpreter needs TRITON_INTERPRET=1 from the process start: use triton_store.conformance()"
        )


def load_with_triton(relative: str, device: str = "cpu") -> types.ModuleType:
    """vLLM's module file ``relative`` (e.g. ``vllm/v1/attention/ops/x.py``) executed with the real Triton,
    as the private module ``evalkit_triton.<stem>`` (vLLM's own module is left as it is). On ``cuda``, vLLM's
    own module, imported (vLLM imports the real Triton there)."""
    if str(device).startswith("cuda"):
        if not (_vllm_root() / relative).is_file():
            raise EngineUnavailableError(f"the installed vLLM has no {relative}")
        return importlib.import_module(relative.removesuffix(".py").replace("/", "."))
    check_interpreting()
    path = _vllm_root() / relative
    if not path.is_file():
        raise EngineUnavailableError(f"the installed vLLM has no {relative}")
    name = f"evalkit_triton.{path.stem}"
    if name in sys.modules:
        return sys.modules[name]
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    with _real_triton_utils():
        spec.loader.exec_module(module)
    sys.modules[name] = module
    return module


@dataclass
class StoreConformance:
    kv_cache_dtype: str
    values: int
    scales_equal: int
    scales: int
    codes_equal: int
    classes: dict[str, int] = field(default_factory=dict)  # FP8: differing codes by class
    scale_classes: dict[str, int] = field(default_factory=dict)  # differing scales by class

    @property
    def exact(self) -> bool:
        return self.scales_equal == self.scales and self.codes_equal == self.values

    def to_dict(self) -> dict:
        return {
            "kv_cache_dtype": self.kv_cache_dtype,
            "values": self.values,
            "scales_equal": self.scales_equal,
            "scales": self.scales,
            "codes_equal": self.codes_equal,
            "classes": self.classes,
            "scale_classes": self.scale_classes,
        }


def sample(seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    """Seeded K and V: normal values at several magnitudes per token, an all-zero head, exact halves."""
    g = torch.Generator().manual_seed(seed)
    tokens, heads, size = SHAPE
    mag = torch.tensor(STDS)[torch.arange(tokens) % len(STDS)][:, None, None]
    key, value = (torch.randn(SHAPE, generator=g) * mag for _ in range(2))
    key[0, 0] = 0.0
    key[1, 0, :6] = torch.tensor([127.0, 63.5, -63.5, 0.5, -0.5, 2.5])  # scale 1: INT8 codes at halves
    value[1, 0, :4] = torch.tensor([448.0, 13.0, -13.0, 0.4375])  # scale 1: E4M3 midpoints (12|14, .4375)
    return key, value


def fp8_classes(got: torch.Tensor, want: torch.Tensor, y: torch.Tensor) -> dict[str, int]:
    """Classify differing E4M3 codes (float8 tensors) given the scaled float32 values ``y``."""
    differ = got.view(torch.uint8) != want.view(torch.uint8)
    g, w, yy = got.float()[differ], want.float()[differ], y[differ]
    bits = want.view(torch.uint8)[differ].to(torch.int32)
    same_sign = torch.sign(g) == torch.sign(w)
    toward = same_sign & (g.abs() < w.abs())
    away = same_sign & (g.abs() > w.abs())
    tie = (yy - w).abs() == (yy - g).abs()
    carry = (torch.frexp(w.abs())[0] == 0.5) & (g == w / 2) & (yy.abs() < w.abs())
    tiny = (w.abs() == 2.0**-9) & (g == 0) & (yy.abs() < w.abs())
    carry = carry & ~tiny
    out = {
        "carry_lost": int(carry.sum()),
        "min_subnormal_lost": int(tiny.sum()),
        "tie_to_odd": int((tie & (bits % 2 == 0) & ~carry).sum()),
        "one_code_toward_zero": int((toward & ~tie & ~carry).sum()),
        "one_code_away_from_zero": int((away & ~tie & ~carry).sum()),
    }
    out["other"] = int(differ.sum()) - sum(out.values())
    return {k: v for k, v in out.items() if v}
