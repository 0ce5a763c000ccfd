"""What llama.cpp's CPU attention does to Q, for the ``llamacpp:`` schemes.

llama.cpp never multiplies a float Q by the stored K. Its CPU flash-attention kernel (and the mul_mat
path without flash attention alike) first converts each Q row to the K type's ``vec_dot_type`` with
that type's ``from_float``, then takes the type's dot product (an integer dot times the two fp16
scales for the block types):

====================  ===============
K cache type          Q converted to
====================  ===============
f32                   f32 (unchanged)
f16 / bf16            f16 / bf16
q8_0, q4_0, q5_0,     q8_0 (blocks of 32, fp16 scale, int8 codes)
iq4_nl
q4_1, q5_1            q8_1 (q8_0's codes plus the block's scaled sum, for the zero point's term)
====================  ===============

When K is rotated (a quantized K with head_dim % 64 == 0), Q was rotated by the same Walsh-Hadamard
transform after RoPE, so the block quantization applies to ``H q``. In the unrotated space the score
llama.cpp computes is ``q_hat . k_hat`` with ``q_hat = H dequant(q8_0(H q))`` and ``k_hat`` as the
storage cache keeps it (:mod:`evalkit.kv.codecs.llamacpp.family`); :func:`round_query` returns ``q_hat``.

Approximate: q8_1 is modelled by q8_0's codes and scale (the q4_1/q5_1 dot adds ``m_k * s_q`` with
``s_q`` the fp16-rounded ``d_q * sum(q)``, where this uses the exact sum of the dequantized codes);
llama.cpp's FP16 accumulation of V (with an f16 V cache), its softmax and its dot's float order are
not modelled. The emulation's logits are therefore not llama.cpp's bit for bit: it is the change the
cache makes that the conformance statistics compare.
"""

from __future__ import annotations

import torch

from evalkit.kv.codecs.llamacpp import ggml_blocks as gb

VEC_DOT_TYPE = {
    "f32": "f32",
    "f16": "f16",
    "bf16": "bf16",
    "q8_0": "q8_0",
    "q4_0": "q8_0",
    "q5_0": "q8_0",
    "iq4_nl": "q8_0",
    "q4_1": "q8_1",
    "q5_1": "q8_1",
}


def round_query(q: torch.Tensor, type_k: str, head_dim: int) -> torch.Tensor:
    """Q (..., head_dim) as llama.cpp's attention reads it against a ``type_k`` K cache (see the module
    docstring), in Q's dtype."""
    target = VEC_DOT_TYPE[type_k]
    if target == "f32":
        return q
    if target in ("f16", "bf16"):
        return q.to(torch.float16 if target == "f16" else torch.bfloat16).to(q.dtype)
    n = gb.rotation(type_k, "k", head_dim)
    x = q.float()
    if n:
        x = gb.fwht_llamacpp(x, n)
    x = gb.decode("q8_0", gb.encode("q8_0", x.contiguous()))
    if n:
        x = gb.fwht_llamacpp(x, n)
    return x.to(q.dtype)
