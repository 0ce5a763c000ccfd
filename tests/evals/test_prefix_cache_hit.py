"""Prefix-cache hits (``--generation-prefix-cache-hit``): the shared prefix read through the stored
codes by the requests that reuse it. Under the identity scheme the mode reproduces its baseline bit for
bit; under TurboQuant, whose first-chunk prefill reads raw K/V, it changes what the rest of the prompt
reads and so the row.

The reference for what a hit reads is plain: the prompt's last-position logits from one forward of the
whole prompt, and from the shared blocks prefilled into a cache followed by the rest of the prompt.
"""

from __future__ import annotations

import json

import pytest
import torch

from evalkit.errors import EvalkitError
from evalkit.evals.base import get_eval
from evalkit.evals.lmeval.prefix_hits import PrefixHits, hits_note
from evalkit.integration.hf_compat import cache_inputs
from evalkit.integration.install import quantized_kv
from evalkit.kv.scheme import parse_scheme

from tests.tiny_models import turboquant_llama

TQ = "vllm:turboquant_4bit_nc"
TEMPLATE = (
    "{% for m in messages %}<|{{ m['role'] }}|>{{ m['content'] }}\n{% endfor %}"
    "{% if add_generation_prompt %}<|assistant|>{% endif %}"
)
SYSTEM = "You are a careful assistant. " * 12  # the prefix every prompt shares, beside the template
PARAMS = {"tasks": "evalkit_arith", "limit": 4, "max_gen_toks": 10, "system_prompt": SYSTEM, "batch_size": 2}


@pytest.fixture(scope="module")
def deep(tmp_path_factory, tiny_tokenizer_dir):
    """A tiny llama of 6 layers, head_dim 64 (TurboQuant quantizes layers 2 and 3), with a chat template. At the
    default initializer range its greedy output repeats one token whatever attention reads."""
    # weights large enough that a greedy continuation follows what attention reads
    lm = turboquant_llama(tmp_path_factory.mktemp("deep"), tiny_tokenizer_dir, initializer_range=0.3)
    lm.tokenizer.chat_template = TEMPLATE
    return lm


def _last_logits(model, ids, hit, session=None):
    """The last position's logits: one forward (``hit`` 0) or the first ``hit`` tokens prefilled, then the rest."""
    with torch.inference_mode():
        if not hit:
            return model(input_ids=ids).logits[0, -1]
        cache = PrefixHits(model, session).prefilled(ids[:, :hit])
        return model(input_ids=ids[:, hit:], **cache_inputs(model, cache)).logits[0, -1]


@pytest.mark.parametrize("rest", [40, 200])  # the rest of the prompt: the decode kernel's path, and the long one
def test_a_hit_reads_the_prefix_quantized_under_turboquant_only(deep, rest):
    model = deep.model
    ids = torch.randint(0, 500, (1, 64 + rest), generator=torch.Generator().manual_seed(1))
    plain_one, plain_hit = _last_logits(model, ids, 0), _last_logits(model, ids, 64)
    with quantized_kv(model, "auto") as session:
        assert torch.equal(
            _last_logits(model, ids, 64, session), plain_hit
        )  # identity: the plain two steps, bit for bit
    with quantized_kv(model, TQ) as session:
        assert torch.equal(_last_logits(model, ids, 0), plain_one)  # a miss: TurboQuant's prefill reads raw K/V
        moved = (_last_logits(model, ids, 64, session) - plain_hit).abs().max()
    assert moved > 1e-4 and (plain_hit - plain_one).abs().max() < 1e-4  # the hit, not the float order, moved it


def _run(lm, folder, scheme, **extra):
    ev = get_eval("generation")({**PARAMS, **extra})
    ev.prepare(lm, folder / "work")
    out = folder / str(scheme).replace("/", "_").replace(":", "_")
    rows = ev.evaluate(lm, parse_scheme(scheme), out)
    items = json.loads((out / "generation_items.json").read_text())
    return ev, {r.metric.split("[")[0]: r for r in rows if "bucket" not in r.labels}, items


def _texts(records):
    return {t: [[s["text"] for s in r["samples"]] for r in rs] for t, rs in records.items()}


@pytest.mark.slow
def test_identity_reproduces_its_baseline_with_hits(deep, tmp_path):
    ev, rows, items = _run(deep, tmp_path, "auto", prefix_cache_hit=True)
    assert _texts(items["tasks"]) == _texts(ev.baseline["tasks"])
    assert rows["evalkit_arith/flip_rate"].value == 0.0 and rows["evalkit_arith/divergence_share"].value == 0.0
    assert ev._hits[0] == 0 and all(h >= 16 and h % 16 == 0 for h in ev._hits[1:])  # the first computes the prefix
    assert rows["evalkit_arith/accuracy"].info["prefill"] == hits_note(ev._hits)
    assert ev.canonical_params()["prefix_cache_hit"] is True


@pytest.mark.slow
def test_hits_change_a_turboquant_row(deep, tmp_path):
    _, without, items_without = _run(deep, tmp_path / "off", TQ)
    ev, with_hits, items_with = _run(deep, tmp_path / "on", TQ, prefix_cache_hit=True)
    assert "prefix_cache_hit" not in get_eval("generation")(PARAMS).canonical_params()
    assert "prefill" not in without["evalkit_arith/accuracy"].info
    assert _texts(items_with["tasks"]) != _texts(items_without["tasks"])


def test_traces_with_hits_are_refused_in_one_line():
    with pytest.raises(EvalkitError, match="prefix caching for the tasks, not the traces"):
        get_eval("generation")({**PARAMS, "traces": "example_traces.jsonl", "prefix_cache_hit": True})


@pytest.mark.slow
def test_longcontext_identity_reproduces_its_baseline_with_hits(deep, tmp_path):
    """RULER's items at one length share the instructions and the haystack's opening: later items hit them."""
    params = {"tasks": ["longctx_ruler_niah_single_1"], "limit": 2, "prefix_cache_hit": True}
    ev = get_eval("longcontext")(params)
    ev.prepare(deep, tmp_path / "work")
    rows = ev.evaluate(deep, parse_scheme("auto"))
    diffs = [r for r in rows if r.metric.endswith("/score_diff")]
    assert diffs and all(r.value == 0.0 for r in diffs)
    assert any(ev._hits) and all(h % 16 == 0 for h in ev._hits)
    assert diffs[0].info["prefill"] == hits_note(ev._hits)
    assert "prefix_cache_hit" not in get_eval("longcontext")({**params, "prefix_cache_hit": False}).canonical_params()
