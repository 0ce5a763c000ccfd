"""Plain re-computations of the generation evaluation's rows from its stored per-item answers (the
``generation_items.json`` of a run and the baseline's), written out with loops and the textbook formulas,
for the tests on the tiny and the embedded model."""

from __future__ import annotations

import itertools
import math

import numpy as np
import pytest

from tests.evals import paired_reference as R

Z = 1.959963984540054


def wilson(k: int, n: int) -> tuple[float, float]:
    centre = (k + Z * Z / 2) / (n + Z * Z)
    half = Z * math.sqrt(k * (n - k) / n + Z * Z / 4) / (n + Z * Z)
    return centre - half, centre + half


def mcnemar_p(b: int, c: int) -> float:
    n = b + c
    return 1.0 if n == 0 else min(1.0, 2 * sum(math.comb(n, i) for i in range(min(b, c) + 1)) / 2**n)


def pass_at(row: list[float], k: int) -> float:
    subsets = list(itertools.combinations(range(len(row)), k))
    return sum(any(row[i] == 1.0 for i in s) for s in subsets) / len(subsets)


def first_difference(a: list[int], b: list[int]) -> int | None:
    i = 0
    while i < len(a) and i < len(b) and a[i] == b[i]:
        i += 1
    return None if i == len(a) == len(b) else i


def bucket(tokens: int) -> str:
    low, high = 0, 31
    while tokens > high:
        low, high = high + 1, 2 * high + 1
    return f"{low}-{high}"


def by_metric(rows) -> dict:
    """{(metric, bucket label or None): row} of MetricRow objects or store row dicts."""
    out = {}
    for r in rows:
        d = r if isinstance(r, dict) else r.to_dict()
        out[(d["metric"], (d["labels"] or {}).get("bucket"))] = d
    return out


def check_outcomes(rows: dict, prefix: str, base: list[dict], mine: list[dict], prompt_tokens=None) -> None:
    """accuracy, pass@k, accuracy_delta, McNemar, flips and accuracy by length, from per-item records
    (base and mine in the same item order, samples in the same seed order); ``prompt_tokens`` per item,
    the length the by-length rows bucket on (None: only that the buckets partition the items)."""
    n_items, k = len(mine), len(mine[0]["samples"])
    right = [[s["correct"] for s in r["samples"]] for r in mine]
    base_right = [[s["correct"] for s in r["samples"]] for r in base]
    total = sum(map(sum, right))
    acc = rows[(f"{prefix}accuracy", None)]
    assert acc["value"] == pytest.approx(total / (n_items * k), abs=1e-12)
    deff = R.share_design_effect(right)  # the item as the unit: Wilson on design-effect-scaled counts
    assert (acc["ci_low"], acc["ci_high"]) == pytest.approx(
        R.wilson(total / deff, n_items * k / deff, R.cluster_z(n_items, k)), abs=1e-9
    )
    if k >= 2:
        per_item = [pass_at(r, k) for r in right]
        assert rows[(f"{prefix}pass@{k}", None)]["value"] == pytest.approx(np.mean(per_item), abs=1e-12)
    b = sum(x == 1 and y == 0 for br, r in zip(base_right, right) for x, y in zip(br, r))
    c = sum(x == 0 and y == 1 for br, r in zip(base_right, right) for x, y in zip(br, r))
    changes = [
        sum(y - x for x, y in zip(br, r) if x != y) for br, r in zip(base_right, right)
    ]  # per item: wrong->right minus right->wrong samples
    want = mcnemar_p(b, c) if k == 1 else R.sign_flip_p([int(x) for x in changes])
    assert rows[(f"{prefix}mcnemar_p", None)]["value"] == pytest.approx(want, abs=1e-12)
    assert rows[(f"{prefix}flip_right_to_wrong", None)]["value"] == pytest.approx(b / (n_items * k), abs=1e-12)
    assert rows[(f"{prefix}flip_wrong_to_right", None)]["value"] == pytest.approx(c / (n_items * k), abs=1e-12)
    d = [np.mean(r) - np.mean(br) for br, r in zip(base_right, right)]
    delta = rows[(f"{prefix}accuracy_delta", None)]
    assert delta["value"] == pytest.approx(np.mean(d), abs=1e-12)
    want = R.clustered_change_interval(base_right, right)  # Tango's, design-effect-scaled counts
    assert (delta["ci_low"], delta["ci_high"]) == pytest.approx(want, abs=1e-7)
    buckets = {label: r for (metric, label), r in rows.items() if metric == f"{prefix}accuracy_by_length"}
    if prompt_tokens is None:
        assert sum(r["info"]["n_items"] for r in buckets.values()) == n_items
        return
    groups: dict[str, list[tuple[float, float]]] = {}
    for br, r, length in zip(base, mine, prompt_tokens):  # an item's samples in its prompt's bucket
        for bs, s in zip(br["samples"], r["samples"]):
            groups.setdefault(bucket(length), []).append((s["correct"], bs["correct"]))
    assert set(buckets) == set(groups)
    for label, pairs in groups.items():
        row = rows[(f"{prefix}accuracy_by_length", label)]
        assert row["value"] == pytest.approx(np.mean([p[0] for p in pairs]), abs=1e-12)
        assert row["info"]["baseline_accuracy"] == pytest.approx(np.mean([p[1] for p in pairs]), abs=1e-12)
        assert row["info"]["n_item_samples"] == len(pairs)


def check_divergence(rows: dict, prefix: str, steps: list[int | None]) -> None:
    diverged = sorted(s for s in steps if s is not None)
    share = rows[(f"{prefix}divergence_share", None)]
    assert share["value"] == pytest.approx(len(diverged) / len(steps), abs=1e-12)
    if diverged:
        assert rows[(f"{prefix}first_divergence", None)]["value"] == diverged[math.ceil(len(diverged) / 2) - 1]
    else:
        assert (f"{prefix}first_divergence", None) not in rows


def check_lengths(rows: dict, prefix: str, mine: list[dict]) -> None:
    per_item = [np.mean([s["tokens"] for s in r["samples"]]) for r in mine]
    assert rows[(f"{prefix}output_tokens", None)]["value"] == pytest.approx(np.mean(per_item), abs=1e-9)
    cut = [s["truncated"] for r in mine for s in r["samples"]]
    assert rows[(f"{prefix}truncated_share", None)]["value"] == pytest.approx(np.mean(cut), abs=1e-12)


def check_task(rows_list, task: str, filt: str, base: list[dict], mine: list[dict], tokenizer) -> None:
    """Every row of one task and filter against the stored per-item answers."""
    rows = by_metric(rows_list)
    suffix = "" if filt == "none" else f"[{filt}]"
    rows = {
        (m.removesuffix(suffix), b): r for (m, b), r in rows.items() if m.startswith(f"{task}/") and m.endswith(suffix)
    }
    base = sorted((r for r in base if r["filter"] == filt), key=lambda r: r["doc_id"])
    mine = sorted((r for r in mine if r["filter"] == filt), key=lambda r: r["doc_id"])
    assert [r["doc_id"] for r in base] == [r["doc_id"] for r in mine]
    for r in mine:  # the stored extraction: the last number of the text, lm-eval's regex filter
        for s in r["samples"]:
            assert s["tokens"] == len(tokenizer(s["text"], add_special_tokens=False)["input_ids"])
    prefix = f"{task}/"
    prompts = [len(tokenizer(r["prompt"], add_special_tokens=False)["input_ids"]) for r in base]
    check_outcomes(rows, prefix, base, mine, prompts)
    changed = [bs["answer"] != s["answer"] for br, r in zip(base, mine) for bs, s in zip(br["samples"], r["samples"])]
    assert rows[(f"{prefix}flip_rate", None)]["value"] == pytest.approx(np.mean(changed), abs=1e-12)
    ids = lambda text: tokenizer(text, add_special_tokens=False)["input_ids"]  # noqa: E731
    steps = [
        first_difference(ids(bs["text"]), ids(s["text"]))
        for br, r in zip(base, mine)
        for bs, s in zip(br["samples"], r["samples"])
    ]
    check_divergence(rows, prefix, steps)
    check_lengths(rows, prefix, mine)


def check_traces(rows_list, base: list[dict], mine: list[dict], reference_of) -> None:
    """The traces rows against the stored generations; ``reference_of(record)`` the line's reference."""
    rows = {k: v for k, v in by_metric(rows_list).items() if k[0].startswith("traces/")}
    for r in mine:
        for s in r["samples"]:
            ref = reference_of(r)
            if ref is not None:  # the reference as a whole phrase, case-insensitive
                text = " ".join(s["text"].lower().split())
                hits = [i for i in range(len(text)) if text.startswith(ref.lower(), i)]
                whole = any(
                    (i == 0 or not text[i - 1].isalnum())
                    and (i + len(ref) == len(text) or not text[i + len(ref)].isalnum())
                    for i in hits
                )
                assert s["correct"] == float(whole)
    judged = [k for k, r in enumerate(mine) if r["reference"] is not None]
    if judged:
        check_outcomes(rows, "traces/", [base[k] for k in judged], [mine[k] for k in judged])
    pairs = [(bs, s) for br, r in zip(base, mine) for bs, s in zip(br["samples"], r["samples"])]
    assert rows[("traces/flip_rate", None)]["value"] == pytest.approx(
        np.mean([bs["ids"] != s["ids"] for bs, s in pairs]), abs=1e-12
    )
    check_divergence(rows, "traces/", [first_difference(bs["ids"], s["ids"]) for bs, s in pairs])
    check_lengths(rows, "traces/", mine)


def plain_shapes(ids: list[int], text: str, truncated: bool, split: int | None) -> dict[str, bool]:
    """The failure shapes of one generation, written out with loops (thresholds: the gates module's
    docstring: 25 % repeated tokens, 50 % repeated 4-grams from 8 tokens, a final run of 16)."""
    n = len(ids)
    repeats = 0
    for i in range(1, n):
        if ids[i] == ids[i - 1]:
            repeats += 1
    grams = [tuple(ids[i : i + 4]) for i in range(n - 3)]
    seen_before = 0
    for i in range(len(grams)):
        if grams[i] in grams[:i]:
            seen_before += 1
    run = 0
    i = n - 1
    while i >= 0 and ids[i] == ids[n - 1]:
        run += 1
        i -= 1
    return {
        "repeated_token": n >= 8 and repeats / (n - 1) >= 0.25,
        "repeated_ngram": n >= 8 and seen_before / len(grams) >= 0.5,
        "first_token_eos": n == 0 and not truncated,
        "collapse": run >= 16,
        "runaway": truncated,
        "invalid_utf8": "\ufffd" in text or bool(split),
    }


def check_gates(rows_list, prefix: str, base: list[list[dict]], mine: list[list[dict]]) -> dict[str, int]:
    """The ``fail_<gate>`` rows against a plain re-computation from per-item generations (``base[i][j]``,
    ``mine[i][j]``: dicts of ids, text, truncated, split); returns each gate's count of item-samples fired."""
    rows = by_metric(rows_list)
    n, k = len(mine), len(mine[0])
    gates = ("repeated_token", "repeated_ngram", "first_token_eos", "collapse", "runaway", "invalid_utf8")
    fired = {g: [[0.0] * k for _ in range(n)] for g in (*gates, "any")}
    for i in range(n):
        for j in range(k):
            b, o = base[i][j], mine[i][j]
            sb = plain_shapes(b["ids"], b["text"], b["truncated"], b.get("split"))
            so = plain_shapes(o["ids"], o["text"], o["truncated"], o.get("split"))
            for g in gates:
                if so[g] and not sb[g]:
                    fired[g][i][j] = 1.0
                    fired["any"][i][j] = 1.0
    counts = {}
    for g, matrix in fired.items():
        row = rows[(f"{prefix}fail_{g}", None)]
        total = sum(map(sum, matrix))
        counts[g] = int(total)
        assert row["info"]["n_fired"] == total
        assert row["value"] == pytest.approx(total / (n * k), abs=1e-12)
        deff = R.share_design_effect(matrix)
        low, high = R.wilson(total / deff, n * k / deff, R.cluster_z(n, k))
        assert (row["ci_low"], row["ci_high"]) == pytest.approx((low, high), abs=1e-9)
    return counts


def task_generations(records: list[dict], tokenizer) -> list[list[dict]]:
    """A task's generations as :func:`check_gates` reads them: the first filter's items (every filter holds
    the same text), the text re-encoded by the tokenizer."""
    first = records[0]["filter"]
    return [
        [{"ids": tokenizer(s["text"], add_special_tokens=False)["input_ids"], **s} for s in r["samples"]]
        for r in records
        if r["filter"] == first
    ]


def trace_generations(records: list[dict], tokenizer) -> list[list[dict]]:
    """A traces file's generations as :func:`check_gates` reads them: the generated ids without the closing
    end-of-sequence token, and how many of them decode alone to U+FFFD."""
    return [
        [
            {
                "ids": s["ids"][: s["tokens"]],
                "text": s["text"],
                "truncated": s["truncated"],
                "split": sum("\ufffd" in tokenizer.decode([t]) for t in s["ids"][: s["tokens"]]),
            }
            for s in r["samples"]
        ]
        for r in records
    ]
