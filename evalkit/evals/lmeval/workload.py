"""The lmeval evaluation's size for ``sweep --dry-run``, from its parameters and the model's facts.

Evalkit's offline tasks (``tasks/lmeval``) by building lm-eval's requests and tokenizing them;
lm-eval's built-in tasks whose data is not here from :data:`LMEVAL_TASK_SIZES` (documented sizes,
approximate). One-token answer choices share one forward per question, as lm-eval's HFLM
computes them; generation counts its full ``max_gen_toks`` budget (an upper bound).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from evalkit.evals.sizing import AUTO_BATCH, CHARS_PER_TOKEN, Forwards, Work, count_tokens

LMEVAL_ROW_BYTES = 2500  # lm-eval rows carry the task config in their info


@dataclass(frozen=True)
class TaskSize:
    """A built-in lm-eval task's size, for when its data is not on this machine (approximate)."""

    docs: int  # test documents (all subtasks)
    subtasks: int  # leaf tasks: lm-eval's ``limit`` applies to each
    question_tokens: int  # one document's prompt without few-shot examples (Llama-3-style tokenizer)
    shot_tokens: int  # one few-shot example (question and answer)
    default_shots: int
    choices: int  # answer choices (multiple_choice), 0 for generation
    one_token_choices: bool  # every choice is one token: one forward per document (lm-eval's logits cache)
    gen_tokens: int  # generation budget (generate_until), 0 for log-likelihood tasks
    source: str


LMEVAL_TASK_SIZES = {
    # MMLU: 14,042 test questions in 57 subjects (Hendrycks et al. 2021; cais/mmlu); lm-eval `mmlu`
    # is 0-shot, choices " A".." D" (one token each). Prompt: evalscope's MMLU page gives 3,212
    # characters mean for 5-shot prompts (6 questions), ~535 per question with its header: ~135 tokens.
    "mmlu": TaskSize(14_042, 57, 135, 125, 0, 4, True, 0, "MMLU test split: 14,042 questions, 57 subjects (cais/mmlu)"),
    # GSM8K: 1,319 test problems (Cobbe et al. 2021; openai/gsm8k); lm-eval `gsm8k` is 5-shot
    # "Question: ...\nAnswer: <worked solution>", generate_until, HFLM's default max_gen_toks 256.
    # Problems average ~46 words (~60 tokens); a solved example ~170 tokens: 5-shot prompt ~910 tokens.
    "gsm8k": TaskSize(1_319, 1, 60, 170, 5, 0, False, 256, "GSM8K test split: 1,319 problems (openai/gsm8k)"),
}


@dataclass
class _Requests:
    loglik: list[int] = field(default_factory=list)  # tokens per forward row
    gen: list[tuple[int, int]] = field(default_factory=list)  # (prompt tokens, generation budget)
    items: int = 0
    chars: int = 0  # prompt characters the logged samples repeat
    leaves: int = 0


def _own_task_requests(names: list[str], params: dict, facts, max_length: int) -> _Requests:
    """Build lm-eval's requests for evalkit's offline tasks and count their tokens exactly."""
    import os
    import warnings
    from pathlib import Path

    from lm_eval.tasks import get_task_dict

    from evalkit.evals.lmeval.adapter import LOGGERS, resolve_tasks
    from evalkit.runtime.runlog import to_log

    out = _Requests()
    tasks = resolve_tasks(names, tuple(params["include"]), {"pretrained": facts.name, **params["metadata"]})
    with to_log(Path(os.devnull), LOGGERS), warnings.catch_warnings():  # lm-eval's chatter and bars: discarded
        warnings.simplefilter("ignore", DeprecationWarning)  # get_task_dict: the dict shape lm-eval's evaluator uses
        task_dict = get_task_dict(list(names), tasks.manager)
        leaves = _leaf_tasks(task_dict)
        for task in leaves:
            if params["num_fewshot"] is not None and task.get_config("num_fewshot") != 0:
                task.set_config(key="num_fewshot", value=params["num_fewshot"])
            elif task.get_config("num_fewshot") is None:
                task.set_config(key="num_fewshot", value=0)
            task.build_all_requests(limit=params["limit"], rank=0, world_size=1)
    out.leaves = len(leaves)
    for task in leaves:
        seen: set = set()
        for inst in task.instances:
            out.items += inst.idx == 0
            kind = inst.request_type
            if kind == "loglikelihood":
                context, cont = inst.args[0], inst.args[1]
                n_cont = count_tokens(facts.tokenizer, cont)
                key = (context, cont if n_cont > 1 else "")  # one-token continuations share the context's forward
                out.chars += len(context) + len(cont)
                if key not in seen:
                    seen.add(key)
                    out.loglik.append(min(max_length, count_tokens(facts.tokenizer, context) + n_cont))
            elif kind == "loglikelihood_rolling":
                n = count_tokens(facts.tokenizer, inst.args[0])
                out.chars += len(inst.args[0])
                out.loglik += [max_length] * (n // max_length) + ([n % max_length] if n % max_length else [])
            else:  # generate_until
                context, kwargs = inst.args[0], inst.args[1]
                out.chars += len(context)
                out.gen.append((count_tokens(facts.tokenizer, context), int(kwargs.get("max_gen_toks", 256))))
    return out


def _leaf_tasks(task_dict) -> list:
    out = []
    for value in task_dict.values():
        out += _leaf_tasks(value) if isinstance(value, dict) else [value]
    return out


def _table_requests(name: str, params: dict) -> _Requests:
    size = LMEVAL_TASK_SIZES[name]
    docs = size.docs if params["limit"] is None else min(size.docs, params["limit"] * size.subtasks)
    shots = size.default_shots if params["num_fewshot"] is None else params["num_fewshot"]
    prompt = size.question_tokens + shots * size.shot_tokens
    out = _Requests(items=docs, leaves=size.subtasks, chars=int(docs * prompt * CHARS_PER_TOKEN * max(1, size.choices)))
    if size.choices:
        forwards = 1 if size.one_token_choices else size.choices
        out.loglik = [prompt + 1] * (docs * forwards)
    else:
        out.gen = [(prompt, size.gen_tokens)] * docs
    return out


def lmeval_work(params: dict, facts, device: str) -> Work:
    from evalkit.evals.lmeval.adapter import TASKS_DIR, task_manager
    from evalkit.evals.lmeval.batching import default_batch_size

    batch = params["batch_size"] or default_batch_size(device)
    if batch == "auto":
        batch = AUTO_BATCH
    max_length = facts.max_length or 2048  # HFLM's: the config's maximum, else 2048
    ours = set(task_manager((str(TASKS_DIR),), False).all_tasks)
    own = [t for t in params["tasks"] if t in ours or t not in LMEVAL_TASK_SIZES]
    approx = []
    reqs = _own_task_requests(own, params, facts, max_length) if own else _Requests()
    if own and facts.tokenizer is None:
        approx.append(f"{', '.join(own)} at ~{CHARS_PER_TOKEN:g} characters per token (no tokenizer here)")
    for name in params["tasks"]:
        if name not in own:
            t = _table_requests(name, params)
            reqs.loglik += t.loglik
            reqs.gen += t.gen
            reqs.items += t.items
            reqs.chars += t.chars
            reqs.leaves += t.leaves
            approx.append(f"lm-eval {name}: documented size ({LMEVAL_TASK_SIZES[name].source}), mean prompt estimated")
    fw: list[Forwards] = []
    loglik = sorted(reqs.loglik, reverse=True)  # lm-eval batches longest first
    for j in range(0, len(loglik), batch):
        rows = loglik[j : j + batch]
        fw.append(Forwards(1, len(rows), max(rows)))
    gen = sorted(reqs.gen, reverse=True)
    for j in range(0, len(gen), batch):
        rows = gen[j : j + batch]
        prompt, steps = max(r[0] for r in rows), max(r[1] for r in rows)
        fw.append(Forwards(1, len(rows), prompt))
        fw.append(Forwards(steps, len(rows), 1, prompt + steps / 2, prompt + steps))
    tokens = sum(reqs.loglik) + sum(p + g for p, g in reqs.gen)
    rows_out = reqs.leaves * 8 + 4 * len(params["tasks"])
    store = rows_out * LMEVAL_ROW_BYTES + reqs.chars + 600 * reqs.items  # lmeval_samples.json repeats the prompts
    fw_t = tuple(fw)
    return Work(
        "lmeval",
        tokens,
        fw_t,
        baseline=fw_t,
        baseline_bytes=reqs.chars + 900 * reqs.items,
        store_bytes=store,
        approximate="; ".join(approx),
    )
