"""A test-only KV codec family, declared here and nowhere else, to show the codec registry at work.

``toy:`` is an engine that stores each (token, head) of K and V as int8 codes followed by one float16
scale, ``amax / 127`` (1 for an all-zero row), in one slot: ``head_dim + 2`` bytes per side. Its one
cache type is ``toy:i8h`` (long form ``int8/token/dynamic+recipe=toy_i8h``); it refuses MLA models and
head sizes above 256. Importing this module registers it (:func:`evalkit.kv.codec.register_family`), as
a module named in ``EVALKIT_CODECS`` does for a process of its own; the tests' ``toy_codec`` fixture
registers it again where an earlier test's teardown took it away. Nothing in the package knows it.
"""

from __future__ import annotations

import torch

from evalkit.errors import SchemeError
from evalkit.kv.codec import register_family
from evalkit.kv.codecs.slot import TOKEN, Codec, SlotFamily, packed
from evalkit.kv.formats import CodecRecipe

MAX_HEAD = 256


def _scale16(x: torch.Tensor) -> torch.Tensor:
    amax = x.float().abs().amax(dim=-1, keepdim=True)
    return torch.where(amax > 0, amax / 127, torch.ones_like(amax)).to(torch.float16)


def encode(x: torch.Tensor, role: str = "k"):
    s = _scale16(x)
    codes = torch.round(x.float() / s.float()).clamp(-127, 127).to(torch.int8)
    stored = torch.cat([codes.view(torch.uint8), s.view(torch.uint8)], dim=-1)
    return packed(codes.float(), stored, codes.float() * s.float(), ~torch.isfinite(x.float()).all())


def decode(stored: torch.Tensor, role: str, head_dim: int) -> torch.Tensor:
    codes = stored[..., :head_dim].contiguous().view(torch.int8).float()
    return codes * stored[..., head_dim:].contiguous().view(torch.float16).float()


def width(role: str, head_dim: int) -> int:
    return head_dim + 2


def check_head_size(head_dim: int) -> None:
    if head_dim > MAX_HEAD:
        raise SchemeError(f"toy:i8h stores head_dim up to {MAX_HEAD}, not {head_dim}: use another scheme")


I8H = Codec(
    name="i8h",
    recipe=CodecRecipe("toy_i8h"),
    format="int8",
    granularity=TOKEN,
    encode=encode,
    decode=decode,
    width=width,
    check_head_size=check_head_size,
    roles_alike=True,
)


class ToyFamily(SlotFamily):
    prefix = "toy"
    engine = "a test-only engine"
    grammar = "toy:i8h[+skip=...]"

    def __init__(self):
        super().__init__((I8H,))

    def parse(self, name: str, options: dict):
        codec = self.by_name(name)
        if codec is None:
            raise SchemeError(f"the toy engine has no cache type {name!r}: write toy:i8h")
        return self.scheme(codec, options)

    def check_layout(self, scheme, is_mla: bool, head_dims: tuple[int, ...]) -> None:
        if is_mla:
            raise SchemeError("toy:i8h stores standard K/V rows: use another scheme for this MLA model")
        for d in head_dims:
            I8H.check_head_size(d)


TOY_FAMILY = register_family(ToyFamily())  # at import: how a module named in EVALKIT_CODECS registers
