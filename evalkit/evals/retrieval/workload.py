"""The retrieval evaluation's size for ``sweep --dry-run``, from its parameters and the model's facts.

Tasks x lengths x depths x samples prompts of exactly ``length`` tokens, plus each sample's answer
budget (the evaluation's own ``max_new_tokens`` rule on the seeded answers); the auto run reuses
the baseline's answers.
"""

from __future__ import annotations

from evalkit.evals.sizing import ROW_BYTES, Forwards, Work, count_tokens


def retrieval_work(params: dict, facts) -> Work:
    from evalkit.evals.retrieval import grid as G
    from evalkit.evals.retrieval.tasks import load_task

    lengths = G.resolve_lengths(params["lengths"], facts.max_length)
    specs = [load_task(t) for t in params["tasks"]]
    fw: list[Forwards] = []
    tokens = 0
    prompts = 0
    for task in specs:
        for length in lengths:
            budgets = []
            for depth in params["depths"]:
                for i in range(params["samples"]):
                    budgets.append(
                        G.sample_needles(
                            task,
                            params["seed"],
                            length,
                            depth,
                            i,  # the run's own rule
                            lambda text: count_tokens(facts.tokenizer, text),
                        )[2]
                    )
            prompts += len(budgets)
            tokens += len(budgets) * length + sum(budgets)
            bs = params["batch_size"]
            for j in range(0, len(budgets), bs):  # batches of one (task, length), as the evaluation groups them
                batch = budgets[j : j + bs]
                steps = max(batch)
                fw.append(Forwards(1, len(batch), length))
                if steps > 1:
                    fw.append(Forwards(steps - 1, len(batch), 1, length + steps / 2, length + steps))
    cells = len(specs) * len(lengths) * len(params["depths"])
    rows = 2 * (cells + len(specs) * len(lengths) + len(specs) + 1)
    approx = "" if facts.tokenizer is not None else "answer lengths at ~4 characters per token (no tokenizer here)"
    fw_t = tuple(fw)
    return Work(
        "retrieval",
        tokens,
        fw_t,
        baseline=fw_t,
        identity_is_baseline=True,
        baseline_bytes=200 * prompts,
        store_bytes=rows * ROW_BYTES + 400 * prompts + 80_000,
        approximate=approx,
    )
