"""Progress through the engine: the runner steps vLLM itself (``VllmRunner.run_requests``) so a bar can follow
the tokens it computes; that loop must give exactly ``LLM.generate``'s answers (greedy tokens and prompt
log-probs), and the bar must count every prompt and generated token. In the vLLM environment
(``/opt/vllm/bin/python -m pytest -q tests/engines/test_vllm_progress.py``); one engine start."""

from __future__ import annotations

import numpy as np
import pytest

from tests.engines.vllm_env import needs_vllm


class Counter:
    def __init__(self):
        self.n = 0

    def update(self, k):
        assert k >= 0
        self.n += k


@needs_vllm
@pytest.mark.slow
def test_stepped_requests_equal_llm_generate_and_count_every_token():
    from vllm import SamplingParams

    from evalkit.engines.vllm.decode import greedy_tokens
    from evalkit.engines.vllm.prompt_logprobs import read_prompt_logprobs
    from evalkit.engines.vllm.runner import VllmRunner
    from evalkit.models.loading import embedded_dense_dir, ensure_embedded

    ensure_embedded("smollm2-135m")
    prompts = [[1, 504, 3458, 282, 260, 1345 + i, 29, 2575] * 3 for i in range(3)]
    with VllmRunner(embedded_dense_dir("smollm2-135m"), kv_cache_dtype="fp8_e4m3", max_model_len=128, top_k=5) as r:
        params = SamplingParams(max_tokens=12, temperature=0.0, ignore_eos=True, detokenize=False)
        plain = [
            list(o.outputs[0].token_ids)
            for o in r.llm.generate([{"prompt_token_ids": p} for p in prompts], params, use_tqdm=False)
        ]
        bar = Counter()
        stepped = [list(o.outputs[0].token_ids) for o in r.run_requests(prompts, params, bar)]
        assert stepped == plain and all(len(t) == 12 for t in plain)
        assert bar.n == sum(len(p) + 12 for p in prompts)
        assert greedy_tokens(r, prompts, 12, progress=False) == plain
        lp = SamplingParams(max_tokens=1, temperature=0.0, prompt_logprobs=5, flat_logprobs=True, detokenize=False)
        want = [
            read_prompt_logprobs(o.prompt_logprobs, p, 5)
            for o, p in zip(r.llm.generate([{"prompt_token_ids": p} for p in prompts], lp, use_tqdm=False), prompts)
        ]
        got = r.prompt_logprobs(prompts, 5)
        for a, b in zip(want, got):
            assert np.array_equal(a.target, b.target) and np.array_equal(a.ids, b.ids) and np.array_equal(a.lps, b.lps)
