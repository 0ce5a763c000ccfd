"""The generation evaluation's size for ``sweep --dry-run``, from its parameters and the model's facts.

lm-eval's reasoning tasks from their documented sizes (:mod:`evalkit.evals.accuracy_tasks`: items,
prompt tokens, the task's own output budget or ``max_gen_toks``), evalkit's offline ``evalkit_arith``
from its shipped problems, and a traces file from its prompts, counted with the model's tokenizer.
Each item is one prefill and ``samples`` x its budget in decode steps (an upper bound: generation
stops at the task's stop sequences), batched as :func:`evalkit.evals.sizing.item_forwards` forms them;
a trace adds the teacher-forced forward its decode KL takes. The baseline pass runs the same items.
"""

from __future__ import annotations

import json
import re

from evalkit.evals.generation.params import TRACE_BUDGET, tasks_dir
from evalkit.evals.sizing import AUTO_BATCH, CHARS_PER_TOKEN, ROW_BYTES, Work, count_tokens, item_forwards

ITEM_BYTES = 1_500  # generation_items.json per item and sample: prompt once, text, answer, tokens


def _arith_task() -> tuple[str, int]:
    """The offline task's prompt template and output budget, read from its YAML (``doc_to_text`` is a
    double-quoted string; the file's ``!function`` tag keeps a plain YAML loader off it)."""
    text = (tasks_dir() / "evalkit_arith.yaml").read_text()
    prompt = json.loads(re.search(r'^doc_to_text: (".*")$', text, re.M).group(1))
    return prompt, int(re.search(r"^\s+max_gen_toks: (\d+)$", text, re.M).group(1))


def _arith_items(params: dict, facts) -> list[tuple[int, int]]:
    template, budget = _arith_task()
    data = json.loads((tasks_dir() / "arith.json").read_text())
    shots = min(params.get("num_fewshot") or 0, len(data["train"]))
    fewshot = sum(count_tokens(facts.tokenizer, d["question"] + d["solution"]) for d in data["train"][:shots])
    test = data["test"][: params["limit"]] if params["limit"] else data["test"]
    gen = params["max_gen_toks"] or budget
    prompt = [template.replace("{{question}}", d["question"]) for d in test]
    return [(fewshot + count_tokens(facts.tokenizer, x), gen) for x in prompt]


def _trace_items(params: dict, facts) -> list[tuple[int, int]]:
    from evalkit.evals.generation.traces import read_traces

    gen = params["max_gen_toks"] or TRACE_BUDGET
    out = []
    for t in read_traces(params["traces"]):
        text = "".join(m["content"] for m in t.chat(params["system_prompt"]))
        out.append((count_tokens(facts.tokenizer, text), gen))
    return out


def generation_work(params: dict, facts, device: str) -> Work:
    from evalkit.evals.accuracy_tasks import generation_plans
    from evalkit.evals.lmeval.batching import default_batch_size

    batch = params["batch_size"] or default_batch_size(device)
    batch = AUTO_BATCH if batch == "auto" else int(batch)
    samples = int(params["samples"])
    fw, tokens, items, approx = [], 0, 0, []
    for plan in generation_plans(params):
        if plan.task == "evalkit_arith":
            for prompt, gen in _arith_items(params, facts):
                fw += item_forwards(1, prompt, gen, samples, batch)
                tokens += samples * (prompt + gen)
                items += 1
        elif plan.facts is None:
            approx.append(f"{plan.task}: no size known here, counted as 0")
        else:
            fw += item_forwards(plan.planned, plan.facts.prompt_tokens, plan.gen_tokens, samples, batch)
            tokens += plan.planned * samples * (plan.facts.prompt_tokens + plan.gen_tokens)
            items += plan.planned
            approx.append(f"{plan.task}: documented size, every generation at its output budget")
    if params["traces"] is not None:
        for prompt, gen in _trace_items(params, facts):
            fw += item_forwards(1, prompt, gen, samples, 1)
            fw += item_forwards(1, prompt + gen, 0, 1, 1)  # the decode KL's teacher-forced pass
            tokens += samples * (prompt + gen) + prompt + gen
            items += 1
    if facts.tokenizer is None and ("evalkit_arith" in params["tasks"] or params["traces"] is not None):
        approx.append(f"prompts at ~{CHARS_PER_TOKEN:g} characters per token (no tokenizer here)")
    fw_t = tuple(fw)
    return Work(
        "generation",
        tokens,
        fw_t,
        baseline=fw_t,
        baseline_bytes=ITEM_BYTES * items * samples,
        store_bytes=16 * max(1, len(params["tasks"])) * ROW_BYTES + ITEM_BYTES * items * samples,
        approximate="; ".join(approx),
    )
