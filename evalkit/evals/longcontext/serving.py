"""How the longcontext tasks are sent to the model: which go through its chat template, and the published
LongBench v2 protocol's second request.

The chat template is lm-eval's own mechanism (``simple_evaluate(apply_chat_template=True)``: each prompt
becomes a user turn rendered by the lm-eval model's ``apply_chat_template``, few-shot examples as turns).
``chat_template`` (the evaluation's parameter) decides per task:

* on: every task through the template (a model without one is refused, as the generation evaluation
  refuses it: :func:`evalkit.evals.generation.serving.require_chat_template`);
* off: none;
* unset (the default): the published LongBench v2 tasks (:func:`evalkit.evals.longcontext.longbench2.protocol_of`)
  through the template where the tokenizer has one, as their authors serve them; every other task
  without, as before this option, so their rows keep their numbers.

Tasks of both kinds in one run take one lm-eval call per kind, their results merged. The published CoT
task's second request (:func:`evalkit.evals.longcontext.longbench2.answer_step`) runs after, on the same
lm-eval model, that is under the same KV scheme.
"""

from __future__ import annotations

from evalkit.errors import EvalkitError
from evalkit.evals.longcontext import longbench2 as lb

_MERGED = ("results", "configs", "versions", "n-shot", "higher_is_better", "n-samples", "samples", "group_subtasks")


def chat_tasks(loaded: dict, chat_template: bool | None, tokenizer) -> set[str]:
    """The leaf tasks prompted through the chat template (see the module docstring)."""
    if chat_template is False:
        return set()
    if chat_template:
        return set(loaded)
    if not getattr(tokenizer, "chat_template", None):
        return set()
    return {name for name, task in loaded.items() if lb.protocol_of(task)}


def check_fit(loaded: dict, samples: dict | None, chat: set[str], tokenizer, max_length: int | None, name: str):
    """EvalkitError naming ``--longcontext-longbench2-max-len`` when a published item's prompt, as rendered, and
    its output budget do not fit the model's context (lm-eval would cut the prompt from the left, silently)."""
    if not max_length:
        return
    for task_name, task in loaded.items():
        if not lb.protocol_of(task):
            continue
        budget = int((task.config.generation_kwargs or {}).get("max_gen_toks", 256))
        chosen = (samples or {}).get(task_name)
        docs = list(task.eval_docs)
        for i in chosen if chosen is not None else range(len(docs)):
            text = docs[i]["prompt"]
            if task_name in chat:
                messages = [{"role": "user", "content": text}]
                text = tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
            n = len(tokenizer.encode(text))
            if n + budget > max_length:
                raise EvalkitError(
                    f"longcontext {task_name} item {i}: its prompt ({n} tokens as sent) and output budget "
                    f"({budget}) exceed {name}'s context of {max_length} tokens: lower "
                    f"--longcontext-longbench2-max-len (published: 120000 for 128k-context models)"
                )


def run_tasks(model, taskset, loaded: dict, samples: dict | None, chat: set[str], tokenizer, max_len: int) -> dict:
    """lm-eval's results for every task of ``loaded`` on ``model``: one call for the tasks in ``chat``
    (through the chat template), one for the others, merged; then the CoT tasks' second request."""
    from evalkit.evals.lmeval.adapter import run_lm_eval

    parts = [([n for n in loaded if n not in chat], False), ([n for n in loaded if n in chat], True)]
    merged: dict = {}
    for names, with_chat in parts:
        if not names:
            continue
        options = {"apply_chat_template": True} if with_chat else {}  # off: the call as it was before
        subset = None if samples is None else {n: samples[n] for n in names if n in samples}
        results = run_lm_eval(
            model,
            taskset,
            num_fewshot=None,
            limit=None,
            bootstrap_iters=0,
            loaded=[loaded[n] for n in names],
            samples=subset,
            **options,
        )
        if not merged:
            merged = results
            continue
        for key in _MERGED:
            if isinstance(results.get(key), dict):
                merged.setdefault(key, {}).update(results[key])
    for name, task in loaded.items():
        if lb.protocol_of(task) == "cot":
            lb.answer_step(model, name, task, merged, tokenizer, name in chat, max_len)
    return merged
