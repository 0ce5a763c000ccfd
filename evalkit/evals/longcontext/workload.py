"""The longcontext evaluation's size for ``sweep --dry-run``, from its parameters and the model's facts.

Real tasks (RULER at each length, LongBench v2 per length class) from their documented sizes
(:mod:`evalkit.evals.accuracy_tasks`): a RULER item fills its length less its generation budget,
which it decodes in full (``until: []``: an upper bound); a LongBench v2 item is one forward of its
prompt (four one-token choices share it). The offline stand-ins from their shipped items, counted with
the model's tokenizer. Batches as :func:`evalkit.evals.sizing.item_forwards` forms them.
RULER generates its items on the CPU when the tasks load (seconds to minutes per length): not timed.
"""

from __future__ import annotations

import json

from evalkit.errors import EvalkitError
from evalkit.evals.sizing import AUTO_BATCH, ROW_BYTES, Work, count_tokens, item_forwards

FIXTURE_GEN = {
    "longctx_ruler_niah_single_1": 32,
    "longctx_ruler_vt": 30,
    "longctx_longbench2": 0,
    "longctx_longbench2_published": 128,  # its YAML's budget
    "longctx_longbench2_published_cot": 1024 + 128,  # the chain of thought, then the answer request (an upper bound)
}
FIXTURE_FILES = {
    "longctx_ruler_niah_single_1": "ruler_niah_single_1.jsonl",
    "longctx_ruler_vt": "ruler_vt.jsonl",
    "longctx_longbench2": "longbench2.jsonl",
    "longctx_longbench2_published": "longbench2.jsonl",
    "longctx_longbench2_published_cot": "longbench2.jsonl",
}


def _fixture_items(task: str, params: dict, facts) -> list[tuple[int, int]]:
    """(prompt tokens, generation budget) of each stand-in item the run evaluates."""
    from evalkit.evals.longcontext.items import length_of
    from evalkit.evals.longcontext.tasks import TASKS_DIR

    docs = [json.loads(line) for line in (TASKS_DIR / FIXTURE_FILES[task]).read_text().splitlines() if line]
    if params["lengths"] and not task.startswith("longctx_longbench2"):
        docs = [d for d in docs if int(d["max_length"]) in set(params["lengths"])]
    cap = params["limits"].get(task, params["limit"])
    seen: dict[str, int] = {}
    out = []
    for d in docs:
        label = length_of(d)
        if cap is not None and seen.get(label, 0) >= cap:
            continue
        seen[label] = seen.get(label, 0) + 1
        text = d.get("input", "") + d.get("gen_prefix", "") + d.get("context", "") + " ".join(d.get("choices", []))
        out.append((count_tokens(facts.tokenizer, text), FIXTURE_GEN[task]))
    return out


def longcontext_work(params: dict, facts, device: str) -> Work:
    from evalkit.evals.accuracy_tasks import longcontext_plans
    from evalkit.evals.longcontext.tasks import PUBLISHED_STANDINS, STANDINS

    standins = {*STANDINS, *PUBLISHED_STANDINS}

    too_long = [n for n in params["lengths"] or () if facts.max_length and n > facts.max_length]
    if too_long:
        raise EvalkitError(
            f"context length {too_long[0]} is above the model's maximum {facts.max_length}: drop it from lengths"
        )
    batch = params["batch_size"]
    batch = AUTO_BATCH if batch in (None, "auto") else int(batch)
    fw, tokens, items, approx = [], 0, 0, []
    for name in params["tasks"]:
        if name in standins:
            for prompt, gen in _fixture_items(name, params, facts):
                fw += item_forwards(1, prompt, gen, 1, 1)
                tokens += prompt + gen
                items += 1
            continue
        plans = [p for p in longcontext_plans({**params, "tasks": [name]}) if p.facts is not None]
        if not plans:
            approx.append(f"{name}: no size known here, counted as 0")
            continue
        for p in plans:
            fw += item_forwards(p.planned, p.facts.prompt_tokens, p.gen_tokens, 1, batch)
            tokens += p.planned * (p.facts.prompt_tokens + p.gen_tokens)
            items += p.planned
        approx.append(f"{name}: documented size, prompts at their length budget")
    if facts.tokenizer is None and any(n in standins for n in params["tasks"]):
        approx.append("stand-ins at ~4 characters per token (no tokenizer here)")
    fw_t = tuple(fw)
    rows = 16 * max(1, len(params["tasks"])) * 8
    return Work(
        "longcontext",
        tokens,
        fw_t,
        baseline=fw_t,
        baseline_bytes=300 * items,
        store_bytes=rows * ROW_BYTES + 400 * items,
        approximate="; ".join(approx),
    )
