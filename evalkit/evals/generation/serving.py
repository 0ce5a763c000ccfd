"""lm-eval generate-until tasks run as the model is served: chat template, system prompt, few-shot turns,
sampling settings and seeded samples, the same on every backend.

Everything goes through lm-eval's own ``simple_evaluate`` (via :func:`evalkit.evals.lmeval.adapter.run_lm_eval`,
which keeps lm-eval's request cache off and its output in the run's log), with its serving options:
``apply_chat_template``, ``system_instruction``, ``fewshot_as_multiturn`` and ``gen_kwargs``
(``do_sample``, ``temperature``, ``top_p``, ``max_gen_toks``: they update each task's own
``generation_kwargs``). Sample j is one lm-eval run seeded with ``seed + j`` (python, numpy and torch:
lm-eval's transformers model draws from torch's generator); a model that takes a seed per request
(lm-eval's vLLM model: vLLM's ``SamplingParams.seed``) gets it in ``gen_kwargs`` too. Few-shot
examples keep lm-eval's fixed few-shot seed, so every sample sees the same prompt.

Refused in one line before any generation: a chat template asked of a model without one, an output
budget at or beyond the model's context, and (on running) a task whose dataset is neither cached nor
downloadable, named with its dataset and how to fetch it.
"""

from __future__ import annotations

from evalkit.errors import EvalkitError

HF_MODEL = "lm_eval.models.huggingface"  # lm-eval's transformers model: seeded through torch's generator


def check_model(lm, p: dict) -> None:
    """EvalkitError when the model cannot be served as ``p`` asks (chat template, output budget)."""
    if p["chat_template"]:
        require_chat_template(lm, "generation")
    budget = p["max_gen_toks"]
    if budget is not None and lm.max_length is not None and budget >= lm.max_length:
        raise EvalkitError(
            f"generation max_gen_toks {budget} is not below {lm.name}'s context of {lm.max_length} tokens: "
            f"lower --generation-max-gen-toks (the prompt needs room too)"
        )


def require_chat_template(lm, eval_name: str) -> None:
    """EvalkitError when ``eval_name``'s ``chat_template`` is asked of a model whose tokenizer has none."""
    if not getattr(lm.tokenizer, "chat_template", None):
        raise EvalkitError(
            f"{lm.name} has no chat template: pass --no-{eval_name}-chat-template (grid: chat_template: false) "
            "to prompt it with plain text, or load a tokenizer that has one"
        )


def seeds(p: dict) -> list[int]:
    """The seed of every sample: ``seed``, ``seed + 1``, ..."""
    return [p["seed"] + j for j in range(p["samples"])]


def takes_request_seed(model) -> bool:
    """Whether the lm-eval model draws samples from a per-request seed (vLLM) rather than torch's generator."""
    return not any(c.__module__ == HF_MODEL for c in type(model).__mro__)


def evaluate_options(p: dict, gen_kwargs: dict, seed: int, request_seed: bool) -> dict:
    """``simple_evaluate``'s serving options for one sample."""
    kwargs = dict(gen_kwargs)
    if kwargs.get("do_sample"):
        if request_seed:
            kwargs["seed"] = seed
        else:  # transformers' generate() draws from the top 50 unless told otherwise; a server's request does not
            kwargs["top_k"] = 0
    return {
        "apply_chat_template": bool(p["chat_template"]),
        "system_instruction": p["system_prompt"],
        "fewshot_as_multiturn": bool(p["fewshot_as_multiturn"]),
        "gen_kwargs": kwargs,
        "random_seed": seed,
        "numpy_random_seed": seed,
        "torch_random_seed": seed,
    }


def settings_info(p: dict, gen_kwargs: dict) -> dict:
    """What a run generated with, for every row's info."""
    return {
        "chat_template": bool(p["chat_template"]),
        "system_prompt": p["system_prompt"],
        "fewshot_as_multiturn": bool(p["fewshot_as_multiturn"]),
        "gen_kwargs": gen_kwargs,
        "samples": p["samples"],
        "seeds": seeds(p),
        "sampling": "seeded sampling (sample j: seed + j on every scheme)" if gen_kwargs["do_sample"] else "greedy",
    }


def offline_own(tasks):
    """``tasks`` with evalkit's own generate-until tasks (``tasks/generation``, data beside their YAML) not
    counted as needing the network, so running only them never probes the hub. A YAML there that reads a
    hub dataset (``dataset_path``: ``mrcr_2needle`` reads ``openai/mrcr``) still counts as needing it."""
    import dataclasses

    from evalkit.evals.generation.params import tasks_dir
    from evalkit.evals.lmeval.adapter import task_manager

    manager = task_manager((str(tasks_dir()),), False)
    index = manager.task_index
    ours = {n for n in manager.all_tasks if not ((getattr(index.get(n), "cfg", None) or {}).get("dataset_path"))}
    return dataclasses.replace(tasks, external=tuple(n for n in tasks.external if n not in ours))


def check_task_types(tasks) -> None:
    """EvalkitError, before any data loads, for a named task whose YAML declares another output type than
    generate_until (groups are checked on their results)."""
    other = []
    for name in tasks.names:
        entry = tasks.manager.task_index.get(name)
        kind = ((entry.cfg if entry is not None else None) or {}).get("output_type")
        if kind is not None and kind != "generate_until":
            other.append(f"{name} ({kind})")
    if other:
        raise EvalkitError(
            f"generation runs generate_until tasks only, not {', '.join(other)}: run those with --eval lmeval"
        )


def datasets_of(tasks) -> dict[str, str]:
    """task -> the hub dataset it reads (``dataset_path``, with its ``dataset_name``), from lm-eval's task
    index (no data loaded), for the tasks that read one."""
    out = {}
    for name in tasks.names:
        entry = tasks.manager.task_index.get(name)
        cfg = (entry.cfg if entry is not None else None) or {}
        if cfg.get("dataset_path"):
            out[name] = cfg["dataset_path"] + (f" ({cfg['dataset_name']})" if cfg.get("dataset_name") else "")
    return out


def run_samples(model, tasks, p: dict, gen_kwargs: dict, tokenizer) -> tuple[dict, dict]:
    """Every sample's lm-eval run on ``model`` (one scheme): (items merged over samples, task info).

    Task info per task: lm-eval's version, n-shot, items and the generation settings it ran with."""
    from evalkit.evals.generation.items import check_generate_until, merge_samples, sample_records
    from evalkit.evals.lmeval.adapter import run_lm_eval

    runs, info = [], {}
    request_seed = takes_request_seed(model)
    default_budget = int(getattr(model, "max_gen_toks", 256))
    for seed in seeds(p):
        options = evaluate_options(p, gen_kwargs, seed, request_seed)
        try:
            results = run_lm_eval(
                model, tasks, num_fewshot=p["num_fewshot"], limit=p["limit"], bootstrap_iters=0, **options
            )
        except EvalkitError as exc:
            if tasks.external and "needs the network" in str(exc):
                sets = datasets_of(tasks)
                raise EvalkitError(
                    f"lm-eval task {', '.join(sets) or ', '.join(tasks.external)} has no local data "
                    f"({'; '.join(f'{t} reads {d}' for t, d in sets.items())}): fetch it once online "
                    "(python -m evalkit run --eval generation --generation-tasks ... with the hub reachable, or "
                    "datasets.load_dataset; gated sets such as Idavidrein/gpqa need `huggingface-cli login` and "
                    "their terms accepted on the hub), then run offline from the cache"
                ) from None
            raise
        check_generate_until(results)
        runs.append(sample_records(results, tokenizer, seed, default_budget))
        for task, cfg in results.get("configs", {}).items():
            info[task] = {
                "task_version": results.get("versions", {}).get(task),
                "n_shot": results.get("n-shot", {}).get(task),
                "generation_kwargs": _plain((cfg or {}).get("generation_kwargs")),
            }
    return merge_samples(runs), info


def _plain(obj):
    import json

    return json.loads(json.dumps(obj, default=str))
