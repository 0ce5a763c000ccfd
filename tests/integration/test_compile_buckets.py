"""One compiled decode step per shape bucket: the bucket rule, padding to a bucket changes no token
or log-probability, and a grid of lm-eval-like batches compiles once per (batch size, bucket)."""

from __future__ import annotations

import pytest
import torch

from evalkit import quantized_kv
from evalkit.integration.compile_cache import COMPILES, bucket_length, cache_length
from evalkit.integration.static_decode import greedy_generate, sampling_warpers

from tests.tiny_models import llama_head64


@pytest.fixture(scope="module")
def gqa():
    return llama_head64(kv_heads=1)


def test_the_bucket_is_the_smallest_of_the_stated_lengths():
    """Buckets: 2**k * m / 4 for m in 4..7, at least 64 (listed here independently of the code)."""
    stated = sorted({2**k * m // 4 for k in range(6, 20) for m in (4, 5, 6, 7)})
    for n in [*range(1, 3000), 8191, 8192, 8193, 32768, 32769, 131072, 131073]:
        want = next(b for b in stated if b >= n)
        assert bucket_length(n) == want, n
        assert want < 1.25 * n + 1 or want == 64  # at most a quarter more than asked, past the smallest
    assert [cache_length(n, False) for n in (1, 16, 17, 22, 600)] == [16, 16, 32, 32, 608]


def _decode(model, scheme, ids, mask, n, bucketed, warpers=None, seed=0):
    logprobs = []
    with torch.inference_mode(), quantized_kv(model, scheme) as session:
        torch.manual_seed(seed)
        tokens = greedy_generate(
            session,
            model,
            ids,
            mask,
            n,
            [],
            0,
            compiled=False,
            on_logits=lambda lg: logprobs.append(torch.log_softmax(lg, -1)),
            warpers=warpers,
            bucketed=bucketed,
        )
    return tokens, torch.stack(logprobs)


@pytest.mark.parametrize(
    "scheme", ["auto", "fp8_e4m3/tensor/dynamic", "vllm:int8_per_token_head", "fp8_e5m2/block16/dynamic", "nvfp4"]
)
@pytest.mark.parametrize("prompt, steps", [(13, 10), (30, 8), (600, 20)])  # 600: past one 512-key block
def test_padding_to_the_bucket_changes_no_token_or_logprob(gqa, scheme, prompt, steps):
    ids = torch.randint(3, 120, (2, prompt), generator=torch.Generator().manual_seed(prompt))
    mask = torch.ones_like(ids)
    mask[1, :3] = 0
    assert bucket_length(prompt + steps - 1) > cache_length(prompt + steps - 1, False)  # the bucket adds positions
    plain = _decode(gqa, scheme, ids, mask, steps, bucketed=False)
    padded = _decode(gqa, scheme, ids, mask, steps, bucketed=True)
    assert torch.equal(padded[0], plain[0])
    assert torch.equal(padded[1], plain[1])


def test_a_sampled_generation_is_the_same_in_its_bucket(gqa):
    ids = torch.randint(3, 120, (2, 21), generator=torch.Generator().manual_seed(3))
    warpers = sampling_warpers(gqa, do_sample=True, temperature=0.7, top_p=0.95)
    plain = _decode(gqa, "fp8_e4m3/tensor/dynamic", ids, torch.ones_like(ids), 16, False, warpers, seed=1)
    padded = _decode(gqa, "fp8_e4m3/tensor/dynamic", ids, torch.ones_like(ids), 16, True, warpers, seed=1)
    assert torch.equal(padded[0], plain[0]) and torch.equal(padded[1], plain[1])


@pytest.mark.slow
def test_a_grid_of_batches_compiles_once_per_bucket(gqa, monkeypatch):
    """lm-eval-like batches (batch 2 but the last, each with its own longest prompt and budget) under
    two schemes: one graph per (batch size, bucket, scheme code path), none for a batch or scheme whose
    graph is already compiled."""
    monkeypatch.setenv("EVALKIT_COMPILE_BACKEND", "eager")
    torch.compiler.reset()

    def batch(rows, prompt, new, scheme):
        ids = torch.randint(3, 120, (rows, prompt), generator=torch.Generator().manual_seed(prompt))
        mask = torch.ones_like(ids)
        mask[-1, :2] = 0
        with torch.inference_mode(), quantized_kv(gqa, scheme) as session:
            greedy_generate(session, gqa, ids, mask, new, [], 0, compiled=True)

    grid = [(2, 9, 6), (2, 20, 8), (2, 40, 12), (2, 70, 6), (2, 75, 5), (1, 30, 6)]  # lengths 14..79
    first = COMPILES.snapshot()
    for rows, prompt, new in grid:
        batch(rows, prompt, new, "fp8_e4m3/tensor/dynamic")
    got = COMPILES.since(first)
    assert got["shapes"] == {"2 x 64": 1, "2 x 80": 1, "1 x 64": 1}
    assert got["graphs"] == 3 and got["seconds"] > 0
    again = COMPILES.snapshot()
    batch(2, 33, 5, "fp8_e4m3/token/dynamic")  # another scheme's code path: its own graph
    for rows, prompt, new in grid[:2]:  # the first scheme again: its graph is kept
        batch(rows, prompt, new, "fp8_e4m3/tensor/dynamic")
    assert COMPILES.since(again)["shapes"] == {"2 x 64": 1}
