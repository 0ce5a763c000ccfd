"""A test-only codec family that brings its own element format: INT6 per (token, head).

``toy6:int6_per_token_head`` stores each (token, head) of K and V as 6-bit two's-complement codes, four
codes in three bytes (code ``i`` of a group of four in bits ``6i .. 6i+5`` of a little-endian 24-bit word),
followed by one float16 scale ``amax / 31`` (1 for an all-zero row): ``3 * head_dim / 4 + 2`` bytes per
side. Codes are ``x / scale`` rounded half to even, clamped to [-31, 31]. evalkit's own store cannot hold
6-bit codes (:func:`evalkit.kv.formats.storable`), so the family registers its element format
(:func:`evalkit.kv.formats.register_format`) and packs the codes in its own slot. Importing this module
registers both; nothing in the package knows them.
"""

from __future__ import annotations

import torch

from evalkit.errors import SchemeError
from evalkit.kv.codec import register_family
from evalkit.kv.codecs.slot import TOKEN, Codec, SlotFamily, packed
from evalkit.kv.formats import CodecRecipe, FormatKind, KVFormat, register_format

QMAX = 31
INT6 = register_format(
    KVFormat("toy_int6", FormatKind.INT, 6, "INT6 symmetric, codes -31..31 (a test family's own)", torch.int8, 31.0)
)


def _scale16(x: torch.Tensor) -> torch.Tensor:
    amax = x.float().abs().amax(dim=-1, keepdim=True)
    return torch.where(amax > 0, amax / QMAX, torch.ones_like(amax)).to(torch.float16)


def pack6(codes: torch.Tensor) -> torch.Tensor:
    """(..., D) integer codes in [-32, 31] -> (..., 3 D / 4) uint8."""
    u = (codes.to(torch.int32) & 0x3F).view(*codes.shape[:-1], -1, 4)
    word = u[..., 0] | (u[..., 1] << 6) | (u[..., 2] << 12) | (u[..., 3] << 18)
    out = torch.stack([(word >> s) & 0xFF for s in (0, 8, 16)], dim=-1)
    return out.reshape(*codes.shape[:-1], -1).to(torch.uint8)


def unpack6(stored: torch.Tensor, head_dim: int) -> torch.Tensor:
    """Inverse of :func:`pack6`: (..., 3 D / 4) uint8 -> (..., D) float32 codes."""
    b = stored.to(torch.int32).view(*stored.shape[:-1], -1, 3)
    word = b[..., 0] | (b[..., 1] << 8) | (b[..., 2] << 16)
    u = torch.stack([(word >> (6 * i)) & 0x3F for i in range(4)], dim=-1)
    return torch.where(u >= 32, u - 64, u).reshape(*stored.shape[:-1], head_dim).to(torch.float32)


def encode(x: torch.Tensor, role: str = "k"):
    s = _scale16(x)
    codes = torch.round(x.float() / s.float()).clamp(-QMAX, QMAX)
    stored = torch.cat([pack6(codes), s.view(torch.uint8)], dim=-1)
    return packed(codes, stored, codes * s.float(), ~torch.isfinite(x.float()).all())


def decode(stored: torch.Tensor, role: str, head_dim: int) -> torch.Tensor:
    body = stored[..., : 3 * head_dim // 4]
    return unpack6(body, head_dim) * stored[..., 3 * head_dim // 4 :].contiguous().view(torch.float16).float()


def width(role: str, head_dim: int) -> int:
    return 3 * head_dim // 4 + 2


def check_head_size(head_dim: int) -> None:
    if head_dim % 4:
        raise SchemeError(
            f"toy6:int6_per_token_head packs 4 codes in 3 bytes: head_dim {head_dim} is not a multiple of 4"
        )


INT6_PER_TOKEN_HEAD = Codec(
    name="int6_per_token_head",
    recipe=CodecRecipe("toy6_int6_per_token_head"),
    format=INT6.name,
    granularity=TOKEN,
    encode=encode,
    decode=decode,
    width=width,
    check_head_size=check_head_size,
    roles_alike=True,
)


class Int6Family(SlotFamily):
    prefix = "toy6"
    engine = "a test-only INT6 engine"
    grammar = "toy6:int6_per_token_head[+skip=...]"

    def __init__(self):
        super().__init__((INT6_PER_TOKEN_HEAD,))

    def parse(self, name: str, options: dict):
        codec = self.by_name(name)
        if codec is None:
            raise SchemeError(f"the toy6 engine has no cache type {name!r}: write toy6:int6_per_token_head")
        return self.scheme(codec, options)

    def check_layout(self, scheme, is_mla: bool, head_dims: tuple[int, ...]) -> None:
        if is_mla:
            raise SchemeError(
                "toy6:int6_per_token_head stores standard K/V rows: use another scheme for this MLA model"
            )
        for d in head_dims:
            check_head_size(d)


INT6_FAMILY = register_family(Int6Family())
