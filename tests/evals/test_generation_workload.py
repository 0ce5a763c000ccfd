"""generation's size for ``sweep --dry-run``: recomputed here by hand from the shipped problems, the traces
file and the reasoning tasks' documented sizes."""

from __future__ import annotations

import json
from pathlib import Path
from types import SimpleNamespace

from evalkit.evals.accuracy_tasks import REASONING_TASKS
from evalkit.evals.base import get_eval
from evalkit.evals.generation.params import GenerationParams
from evalkit.evals.sizing import AUTO_BATCH, Forwards, item_forwards

ROOT = Path(__file__).resolve().parents[2]
NO_TOKENIZER = SimpleNamespace(tokenizer=None, max_length=None)


def size(**params):
    return get_eval("generation").workload(GenerationParams.from_dict(params).to_dict(), NO_TOKENIZER, "cpu")


def chars(text: str) -> int:
    return max(1, round(len(text) / 4.0))  # evalkit.evals.sizing.count_tokens without a tokenizer


def test_the_offline_task_is_one_prefill_and_its_budget_per_problem_and_sample():
    data = json.loads((ROOT / "tasks" / "generation" / "arith.json").read_text())
    prompt = 'Solve the problem. Think step by step, then end with "The answer is N".\nProblem: {}\nSolution:'
    work = size(tasks=["evalkit_arith"], limit=3, samples=2, temperature=0.6, batch_size=4)
    expected, tokens = [], 0
    for d in data["test"][:3]:
        n = chars(prompt.format(d["question"]))
        expected += [Forwards(1, 2, n), Forwards(63, 2, 1, n + 32, n + 64)]  # 2 samples, budget 64
        tokens += 2 * (n + 64)
    assert work.forwards == tuple(expected) and work.baseline == work.forwards
    assert work.tokens == tokens
    assert "characters per token" in work.approximate


def test_reasoning_tasks_use_their_documented_size_batched_by_auto():
    work = size(tasks=["gsm8k_cot_llama", "aime25"], max_gen_toks=512, batch_size="auto")
    g, a = REASONING_TASKS["gsm8k_cot_llama"], REASONING_TASKS["aime25"]
    assert work.forwards == tuple(
        item_forwards(g.docs, g.prompt_tokens, 512, 1, AUTO_BATCH) + item_forwards(a.docs, a.prompt_tokens, 512, 1, 32)
    )
    assert work.tokens == g.docs * (g.prompt_tokens + 512) + a.docs * (a.prompt_tokens + 512)
    assert "gsm8k_cot_llama: documented size" in work.approximate


def test_an_unknown_task_is_counted_as_zero_and_said_so():
    work = size(tasks=["gsm8k_cot_zeroshot"])  # an lm-eval task whose size evalkit does not hold
    assert work.forwards == () and work.tokens == 0
    assert work.approximate == "gsm8k_cot_zeroshot: no size known here, counted as 0"


def test_traces_add_their_generation_and_the_teacher_forced_pass():
    path = ROOT / "tasks" / "generation" / "example_traces.jsonl"
    work = size(tasks="none", traces=str(path), max_gen_toks=16)
    lines = [json.loads(x) for x in path.read_text().splitlines()]
    fw = []
    for line in lines:
        text = line.get("prompt") or "".join(m["content"] for m in line["messages"])
        n = chars(text)
        fw += [Forwards(1, 1, n), Forwards(15, 1, 1, n + 8, n + 16), Forwards(1, 1, n + 16)]
    assert work.forwards == tuple(fw)
