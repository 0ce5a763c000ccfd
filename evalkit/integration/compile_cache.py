"""One compiled decode step per shape bucket, kept across batches and schemes, and a log of the compiles.

A compiled static decode step (:mod:`evalkit.integration.static_decode`) is specialised to its shapes
(``dynamic=False``): the batch and the static cache's length. lm-eval hands every batch its own
longest prompt, so a cache exactly as long as each batch needs would compile once per batch (about
490 batches per scheme for a RULER run). The cache is therefore allocated for a **bucket** of lengths:

* the length is rounded up to the next of 64, 80, 96, 112, 128, 160, 192, 224, 256, 320, ... that is
  ``2**k * m / 4`` for m in 4..7 (at least :data:`MIN_BUCKET`): at most 25 % more positions than
  needed (memory and the per-step read grow with it), four buckets per doubling (40 up to 128k);
* the batch is not padded: a decode step's matrix products pick other kernels for another number of
  rows, which would move the numbers, and lm-eval's batches all have one size but the last.

Bucketed or not, a static cache is a whole number of :data:`ALIGN` (16) positions long. The positions
past the real length are keys the causal mask hides (zero codes), and adding whole groups of 16 of
them changes no number: CPU attention (torch's flash kernel: vectors of 16 float32, blocks of 512
keys) sums a group of 16 keys the same way whether the groups after it are masked or absent. A
cache that ends part-way into a group rounds that group's sums differently (about 1e-7 in the
logits of the tests' tiny model), which is why the unbucketed length is aligned too. Tests:
bucketed and unbucketed decoding give the same tokens and log-probabilities, bit for bit.

Graphs are kept: dynamo caches the compiled step per set of guards (shapes, the scheme's code
path), so a later batch in the same bucket, or a scheme whose step traces to the same graph, replays
what is compiled. At most :data:`MAX_GRAPHS` graphs are held; the next one clears them all
(``torch.compiler.reset()``, CUDA graph pools included) and starts again.

:data:`COMPILES` counts every graph compiled and the seconds its first call took (compile and one
step); the sweep's runner records the difference over a run in the run's info
(``decode_compiles``).
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

ALIGN = 16  # positions: every static cache is a multiple of this long
MIN_BUCKET = 64
MAX_GRAPHS = 64  # kept graphs before a reset (dynamo's per-function limit is raised to this)


def bucket_length(n: int) -> int:
    """The smallest bucket ``>= n``: ``2**k * m / 4`` (m in 4..7), at least :data:`MIN_BUCKET`."""
    if n <= MIN_BUCKET:
        return MIN_BUCKET
    k = (n - 1).bit_length() - 1  # 2**k < n <= 2**(k+1)
    quarter = 2**k // 4
    return -(-n // quarter) * quarter


def cache_length(n: int, bucketed: bool) -> int:
    """A static cache's length for ``n`` positions: its bucket, or ``n`` rounded up to :data:`ALIGN`."""
    return bucket_length(n) if bucketed else -(-n // ALIGN) * ALIGN


@dataclass
class CompileLog:
    """Graphs compiled in this process and the seconds their first calls took, by shape."""

    graphs: int = 0
    seconds: float = 0.0
    shapes: dict = field(default_factory=dict)  # "B x max_len" -> graphs compiled for it

    def snapshot(self) -> tuple[int, float, dict]:
        return self.graphs, self.seconds, dict(self.shapes)

    def since(self, snap: tuple[int, float, dict]) -> dict:
        """What was compiled after ``snap`` (:meth:`snapshot`): graphs, seconds and the shapes."""
        graphs, seconds, shapes = snap
        new = {k: v - shapes.get(k, 0) for k, v in self.shapes.items() if v > shapes.get(k, 0)}
        return {"graphs": self.graphs - graphs, "seconds": round(self.seconds - seconds, 3), "shapes": new}


COMPILES = CompileLog()


def _graphs() -> int:
    from torch._dynamo.utils import counters

    return int(counters["stats"]["unique_graphs"])


def compiled_call(fn, shape: tuple[int, int], *args):
    """Call the compiled ``fn``; a call that compiled graphs is counted in :data:`COMPILES` with its seconds."""
    import torch

    before = _graphs()
    if before - _held[0] >= MAX_GRAPHS:  # the next compile would pass the limit: start again
        torch.compiler.reset()
        _held[0] = before
    start = time.perf_counter()
    with torch._dynamo.config.patch(recompile_limit=MAX_GRAPHS):
        out = fn(*args)
    added = _graphs() - before
    if added:
        COMPILES.graphs += added
        COMPILES.seconds += time.perf_counter() - start
        key = f"{shape[0]} x {shape[1]}"
        COMPILES.shapes[key] = COMPILES.shapes.get(key, 0) + added
    return out


_held = [0]  # the graph count at the last reset
