"""gpu_check's models and sizes: the configs it builds models from (the embedded model's architecture, Llama-3.1-8B's
and its CPU stand-in), the sizes that differ between the GPU run and the CPU self-test, and the state the
sections share (:class:`Context`: the device, the embedded model, the real-size model and section 4's runs).

Every model is built from a config with seeded random weights, on the device (:func:`build_model`): gpu_check
reads no weights and needs no network. Imported by benchmarks/gpu_check.py and its sections.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

import torch

GiB = 2**30

# The embedded model's architecture: SmolLM2-135M-Instruct as evalkit converts it (its dense copy's
# config.json; tests/benchmarks/test_gpu_check.py compares them where that copy exists). evalkit defines it
# nowhere else in full: evalkit.models.loading describes the embedded model only in words.
EMBEDDED_CONFIG = dict(
    model_type="llama",
    vocab_size=49152,
    hidden_size=576,
    intermediate_size=1536,
    num_hidden_layers=30,
    num_attention_heads=9,
    num_key_value_heads=3,
    head_dim=64,
    hidden_act="silu",
    max_position_embeddings=8192,
    rms_norm_eps=1e-5,
    rope_parameters={"rope_type": "default", "rope_theta": 100000.0},
    tie_word_embeddings=True,
    attention_bias=False,
    mlp_bias=False,
    bos_token_id=1,
    eos_token_id=2,
    pad_token_id=2,
    initializer_range=0.02,
)

REAL_PRESET = "llama-3.1-8b"
# What Llama-3.1-8B's config.json has beyond the KV fields of evalkit.models.presets' "llama-3.1-8b".
REAL_EXTRA = dict(
    vocab_size=128256,
    intermediate_size=14336,
    head_dim=128,
    hidden_act="silu",
    rms_norm_eps=1e-5,
    rope_parameters={
        "rope_type": "llama3",
        "rope_theta": 500000.0,
        "factor": 8.0,
        "low_freq_factor": 1.0,
        "high_freq_factor": 4.0,
        "original_max_position_embeddings": 8192,
    },
    tie_word_embeddings=False,
    attention_bias=False,
    mlp_bias=False,
    bos_token_id=128000,
    eos_token_id=128001,
    initializer_range=0.02,
)
# --device cpu: the real-size model scaled down (same family and RoPE, 4 layers, GQA 4:1).
REAL_STANDIN = dict(
    num_hidden_layers=4,
    num_attention_heads=8,
    num_key_value_heads=2,
    hidden_size=256,
    head_dim=32,
    intermediate_size=768,
    vocab_size=4096,
    bos_token_id=1,
    eos_token_id=2,
)


@dataclass(frozen=True)
class Sizes:
    """Everything that differs between the GPU run and the CPU self-test."""

    embedded_layers: int
    batch: int
    seq: int
    decode: int  # teacher-forced steps of section 3
    generate: int  # greedy tokens of section 1
    cast_values: int  # random values per format and rounding in section 2
    real: dict  # the real-size model's config
    real_dtype: torch.dtype
    contexts: tuple[int, ...]
    batches: tuple[int, ...]
    steps: int  # timed decode steps per run
    warmup: int  # warm steps after the first (compiling) one, before the timed ones
    prefill: int  # tokens of the measured prefill (section 6)
    min_s: dict  # per section: the least time it needs to start
    share_s: dict  # per section: its share of the budget
    vllm_tokens: int = 16  # tokens per row of section 7's K and V (batch rows x 8 heads, or 1 MLA latent)
    long_context: int = 131072  # section 4's long run: batch 1 under the probe scheme


SHARES = dict(
    identity=20,
    casts=30,
    storage=60,
    speed=330,
    memory=50,
    estimator=30,
    vllm_dtypes=20,
    vllm_engine=150,
    vllm_native=200,
)  # seconds; 540 of the default 560 before sections 8 and 9, which take ~0 s where vLLM is absent


def real_config(cpu: bool) -> dict:
    from evalkit.models.presets import get_preset

    fields = {**get_preset(REAL_PRESET)["config"], **REAL_EXTRA}
    if cpu:
        fields.update(REAL_STANDIN)
    return fields


def sizes_for(device: str) -> Sizes:
    """GPU: the sizes the issue asks for. CPU: tiny, and the real-size stand-in in float32 (this
    CPU's bf16 matrix-vector products are ~20x slower than float32's: 12 against 0.6 ms for a
    1 x 256 x 4096 product, which would time the CPU's bf16 kernel instead of the storage path)."""
    if not device.startswith("cuda"):
        return Sizes(
            2,
            4,
            24,
            3,
            6,
            2**16,
            real_config(True),
            torch.float32,
            (256, 1024),
            (1, 4),
            4,
            2,
            256,
            dict(
                identity=1.5,
                casts=1.0,
                storage=3.0,
                speed=3.0,
                memory=0.1,
                estimator=2.0,
                vllm_dtypes=1.0,
                vllm_engine=1.0,
                vllm_native=1.0,
            ),
            SHARES,
            8,
            2048,
        )
    return Sizes(
        30,
        4,
        96,
        8,
        16,
        4 * 2**20,
        real_config(False),
        torch.bfloat16,
        (8192, 32768),
        (1, 16),
        16,
        6,
        8192,
        dict(
            identity=10,
            casts=5,
            storage=15,
            speed=60,
            memory=5,
            estimator=15,
            vllm_dtypes=5,
            vllm_engine=0.1,
            vllm_native=0.1,
        ),
        SHARES,
        512,
        131072,
    )


class Context:
    def __init__(self, device: str, sizes: Sizes):
        self.device, self.sizes = torch.device(device), sizes
        self.cuda = self.device.type == "cuda"
        if self.cuda and self.device.index is None:  # tensors report cuda:N, and torch.device("cuda") != cuda:0
            self.device = torch.device("cuda", torch.cuda.current_device())
        self._embedded = None
        self.real = None  # the real-size model, built by section 4, freed after section 6
        self.real_error: str | None = None
        self.real_build_s = 0.0
        self.speed_runs: list[dict] = []  # section 4's runs, read by sections 5 and 6

    def sync(self) -> None:
        if self.cuda:
            torch.cuda.synchronize(self.device)

    def embedded(self):
        if self._embedded is None:
            cfg = {**EMBEDDED_CONFIG, "num_hidden_layers": self.sizes.embedded_layers}
            self._embedded = build_model(cfg, self.device, torch.bfloat16, seed=0)
        return self._embedded

    def padded_batch(self, vocab: int):
        s = self.sizes
        g = torch.Generator().manual_seed(0)
        ids = torch.randint(10, vocab, (s.batch, s.seq), generator=g)
        mask = torch.ones_like(ids)
        mask[1, : s.seq // 10] = 0  # left padding of different lengths
        mask[3 % s.batch, : s.seq // 3] = 0
        return ids.to(self.device), mask.to(self.device)


def build_model(fields: dict, device: torch.device, dtype: torch.dtype, seed: int):
    """A causal LM from a config with seeded random weights, built directly on ``device``."""
    from transformers import AutoConfig, AutoModelForCausalLM

    config = AutoConfig.for_model(**fields)
    torch.manual_seed(seed)
    with torch.device(device):
        model = AutoModelForCausalLM.from_config(config, dtype=dtype, attn_implementation="sdpa")
    if any(p.device != device for p in model.parameters()):  # a release that builds elsewhere: move it (slower)
        model.to(device)
    model.eval()
    return model


def unique_params(model) -> int:
    seen: dict[int, int] = {}
    for p in model.parameters():
        seen.setdefault(id(p), p.numel())
    return sum(seen.values())


def real_model_needs(ctx: Context) -> str | None:
    """Why the real-size model cannot be built here (one line), or None."""
    if not ctx.cuda:
        return None
    from transformers import AutoConfig, AutoModelForCausalLM

    with torch.device("meta"):
        meta = AutoModelForCausalLM.from_config(AutoConfig.for_model(**ctx.sizes.real), dtype=torch.bfloat16)
    need = unique_params(meta) * 2 + 4 * GiB
    free, total = torch.cuda.mem_get_info(ctx.device)
    if free < need:
        return (
            f"too little GPU memory for the real-size model: {free / GiB:.1f} GiB free of {total / GiB:.1f}, "
            f"it needs {need / GiB:.1f} GiB (bf16 weights + 4 GiB)"
        )
    return None


def ensure_real(ctx: Context):
    if ctx.real is None and ctx.real_error is None:
        reason = real_model_needs(ctx)
        if reason:
            ctx.real_error = reason
            print(reason, flush=True)
        else:
            t = time.perf_counter()
            ctx.real = build_model(ctx.sizes.real, ctx.device, ctx.sizes.real_dtype, seed=1)
            ctx.sync()
            ctx.real_build_s = time.perf_counter() - t
            print(f"   real-size model built on {ctx.device} in {ctx.real_build_s:.1f} s", flush=True)
    return ctx.real
