"""The generation evaluation's rows for a traces file (an operator's own prompts,
:mod:`evalkit.evals.generation.traces`): the comparisons of the task rows
(:mod:`evalkit.evals.generation.rows`) under the task name ``traces``.

A traces file gives the same comparisons under the task name ``traces`` (label ``file``): with
references, ``accuracy`` and its paired rows over the lines that have one; ``flip_rate`` (the
generated text differs from the baseline's), the divergence rows (on the generated token ids
themselves), and ``kl_mean`` / ``top1_agreement``: per line the mean KL(baseline || scheme) and argmax
agreement along the baseline's own continuation, averaged over lines (t interval over lines); and the
failure gates on the generated ids themselves (a token not valid UTF-8 on its own counts there).

:func:`trace_records` turns each line's generations into the records these rows read (text, ids, length,
truncation, and with a reference whether it is right).
"""

from __future__ import annotations

import numpy as np

from evalkit.evals.generation import gates as G
from evalkit.evals.generation import paired as P
from evalkit.evals.generation.rows import (
    WILSON_CI,
    bucket_rows,
    divergence_rows,
    length_rows,
    metric_row,
    outcome_rows,
    sample_matrix,
)
from evalkit.evals.rows import MetricRow

KL_CI = "95% over lines: Student's t, upper end at least the lognormal generalized interval's (skewed)"


def trace_records(traces, tokenizer, gens: list[list[list[int]]], seeds: list[int], budget: int) -> list[dict]:
    """Per traces line, per sample: the generation (text and ids), its length and, with a reference,
    whether it is right (:func:`evalkit.evals.generation.traces.matches_reference`)."""
    from evalkit.evals.generation.gates import split_tokens
    from evalkit.evals.generation.trace_decode import output_length
    from evalkit.evals.generation.traces import matches_reference

    eos = tokenizer.eos_token_id
    eos = set([eos] if isinstance(eos, int) else (eos or []))
    out = []
    for trace, samples in zip(traces, gens):
        record = {"line": trace.line, "id": trace.id, "reference": trace.reference, "samples": []}
        for seed, tokens in zip(seeds, samples):
            text = tokenizer.decode(tokens, skip_special_tokens=True)
            n = output_length(tokens, eos)
            record["samples"].append(
                {
                    "seed": seed,
                    "ids": tokens,
                    "text": text,
                    "tokens": n,
                    "truncated": n >= budget,
                    "split_tokens": split_tokens(tokenizer, tokens[:n]),
                    "correct": None if trace.reference is None else float(matches_reference(text, trace.reference)),
                }
            )
        out.append(record)
    return out


def trace_rows(
    base: list[dict], records: list[dict], kl: list[dict] | None, info: dict, prompt_tokens=None
) -> list[MetricRow]:
    """The traces file's rows (see the module docstring); ``prompt_tokens``: each line's prompt length, for
    accuracy by length (no such rows without it)."""
    labels = {"task": "traces", "file": info.get("file", {}).get("name")}
    name = lambda stat: f"traces/{stat}"  # noqa: E731
    rows = []
    judged = [k for k, r in enumerate(records) if r["reference"] is not None]
    if judged:
        base_c = sample_matrix([base[k] for k in judged], "correct")
        mine = sample_matrix([records[k] for k in judged], "correct")
        meta = {**info, "n_with_reference": len(judged), "match": "the reference as a whole phrase, case-insensitive"}
        rows += outcome_rows(name, base_c, mine, labels, meta)
        if prompt_tokens is not None:
            rows += bucket_rows(name, [prompt_tokens[k] for k in judged], base_c, mine, labels, meta)
    pairs = [(bs, os_) for b, o in zip(base, records) for bs, os_ in zip(b["samples"], o["samples"])]
    samples = len(records[0]["samples"]) if records else 1
    flips = np.array([bs["ids"] != os_["ids"] for bs, os_ in pairs], dtype=np.float64).reshape(-1, samples)
    changed = int(flips.sum())
    value, lo, hi, deff = P.clustered_share(flips)
    rows.append(
        metric_row(
            name("flip_rate"),
            value,
            lo,
            hi,
            labels,
            {
                **info,
                "n_flipped": changed,
                "flip": "generation differs from the baseline's",
                "ci": WILSON_CI,
                "design_effect": deff,
            },
        )
    )
    steps = [P.first_divergence(bs["ids"], os_["ids"]) for bs, os_ in pairs]
    rows += divergence_rows(name, steps, labels, {**info, "tokens": "the generated token ids"}, samples)
    rows += length_rows(name, sample_matrix(records, "tokens"), sample_matrix(records, "truncated"), labels, info)

    def outputs(record: dict) -> list[G.Output]:
        return [
            G.Output(s["ids"][: s["tokens"]], s["text"], bool(s["truncated"]), s["split_tokens"])
            for s in record["samples"]
        ]

    fired = G.fire([outputs(b) for b in base], [outputs(o) for o in records])
    rows += G.gate_rows(name, fired, prompt_tokens, labels, {**info, "tokens": "the generated token ids"})
    if kl is not None:
        per_line = [(float(k["kl"].mean()), float(k["kl_lower"].mean()), float(k["agree"].mean())) for k in kl]
        tokens = int(sum(len(k["kl"]) for k in kl))
        along = {**info, "n_lines": len(kl), "n_tokens": tokens, "along": "the baseline's first sample, teacher-forced"}
        value, lo, hi, skewed = P.mean_skewed([x[0] for x in per_line])
        rows.append(
            metric_row(
                name("kl_mean"),
                value,
                lo,
                hi,
                labels,
                {
                    **along,
                    "kl_lower_bound": float(np.mean([x[1] for x in per_line])),
                    "ci": KL_CI if skewed else "95% Student's t over lines",
                },
            )
        )
        value, lo, hi = P.mean_t([x[2] for x in per_line], 0.0, 1.0)
        rows.append(
            metric_row(name("top1_agreement"), value, lo, hi, labels, {**along, "ci": "95% Student's t over lines"})
        )
    return rows
