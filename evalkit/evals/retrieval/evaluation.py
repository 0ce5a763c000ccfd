"""Long-context retrieval: passkey and RULER needle-in-a-haystack tasks across lengths and depths.

``prepare()`` builds the whole grid once per model (tasks from ``tasks/retrieval/*.yaml`` x
context lengths x needle depths x samples; :mod:`evalkit.evals.retrieval.grid`): exact-length token-id
prompts with the chat template, seeded. ``evaluate(scheme)`` answers them greedily through the
storage cache (:func:`evalkit.quantized_kv`), scores
them (:mod:`evalkit.evals.retrieval.scoring`: exact match of the first answer word, or recall of
expected values) and emits rows:

- ``accuracy`` per (task, length, depth) cell, per (task, length), per task, and overall, with a
  95 % interval (Wilson when scores are 0/1, else Student's t);
- ``accuracy_diff``: the paired difference from the baseline on the same prompts, at the same
  levels (Tango's score interval for 0/1 scores, never zero-width; Student's t for recall) (the baseline's answers are computed once and cached per prompt on disk under ``workdir``).

With ``artifacts`` it writes ``retrieval_accuracy.png`` (heatmap per task), ``retrieval_diff.png``
(difference from the baseline) and ``samples.jsonl`` (answers, generations, scores).
"""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path
from typing import Any

import pandas as pd

from evalkit.evals.backend import backend_of, stamp
from evalkit.evals.base import Column, Criterion, Evaluation, MetricRow, ReportSpec, register_eval
from evalkit.evals.output_head import append_lines
from evalkit.evals.retrieval import grid as G
from evalkit.evals.retrieval.params import RetrievalParams  # noqa: F401 (re-exported: it was declared here)
from evalkit.evals.retrieval.scoring import accuracy_ci, difference_ci, difference_method, score
from evalkit.evals.retrieval.tasks import load_task
from evalkit.kv.scheme import Scheme

FORMAT_VERSION = 2  # 2: one storage path (no `via`)


@register_eval("retrieval")
class RetrievalEval(Evaluation):
    grows = "samples"
    numerics_version = 1  # 1: accuracy_diff on 0/1 scores by Tango's score interval (never [0, 0])
    request = "generate"
    Params = RetrievalParams
    summary_metrics = ("accuracy", "accuracy_diff")
    report = ReportSpec(
        columns=(
            Column(
                "accuracy", key="retrieval_acc", heading="retrieval % [95% CI]", fmt=".1f", scale=100, interval=True
            ),
            Column("accuracy_diff", key="retrieval_diff"),
        ),
        plots=("evalkit.evals.retrieval.plots:retrieval_figures",),
        criteria=(
            Criterion(
                "retrieval",
                "retrieval_diff",
                "max_retrieval_drop",
                True,
                "retrieval drop",
                unit=" pts",
                digits=1,
                transform="neg",
            ),
        ),
        order=30,
    )

    @classmethod
    def workload(cls, params: dict[str, Any], facts, device: str = "cpu"):
        from evalkit.evals.retrieval.workload import retrieval_work

        return retrieval_work(params, facts)

    def canonical_params(self) -> dict[str, Any]:
        """The parameters plus a hash of each task file, so an edited task gets a new run id."""
        specs = [load_task(t) for t in self.params["tasks"]]
        files = {s.name: hashlib.sha256(Path(s.source).read_bytes()).hexdigest()[:16] for s in specs}
        return {**self.params, "task_files": files, "format_version": FORMAT_VERSION}

    # ---- grid --------------------------------------------------------------------------------
    def prepare(self, lm, workdir: Path | None) -> None:
        p = self.params
        self.lengths = G.resolve_lengths(p["lengths"], lm.max_length)
        self.specs = {spec.name: spec for spec in (load_task(t) for t in p["tasks"])}
        self.workdir = Path(workdir) if workdir is not None else None
        self.samples = G.build_samples(
            list(self.specs.values()),
            lm.tokenizer,
            self.lengths,
            p["depths"],
            p["samples"],
            p["seed"],
            p["haystack"],
            p["corpus"],
            self.workdir,
            p["chat"],
            lm.max_length,
        )
        self.digest = G.samples_digest(self.samples)
        self._baseline: list[str] | None = None

    def _generate(self, lm, scheme: Scheme, which: list[int] | None = None, on_batch=None) -> list[str]:
        """Continuations of the samples ``which`` (default all), in that order; ``on_batch(idx, texts)``
        is called after each batch with positions into ``which``."""
        from tqdm import tqdm

        which = list(range(len(self.samples))) if which is None else which
        sub = [self.samples[i] for i in which]
        order = G.batches(sub, self.params["batch_size"])
        work = [([list(sub[i].ids) for i in b], max(sub[i].max_new_tokens for i in b)) for b in order]
        out: list[str] = [""] * len(sub)

        def done(k: int, texts: list[str]) -> None:
            for i, t in zip(order[k], texts):
                out[i] = t
            if on_batch is not None:
                on_batch(order[k], texts)

        with tqdm(
            total=len(sub), desc=f"retrieval {scheme}", disable=os.environ.get("EVALKIT_PROGRESS") == "0", leave=False
        ) as bar:
            backend_of(self).generate(lm, scheme, work, bar, on_batch=done)
        return out

    def _baseline_path(self, lm) -> Path | None:
        """One JSONL file of baseline continuations per model and batch size, keyed per prompt (any grid
        with that batch size reuses them): the batch size decides which prompts share a padded forward,
        so the generation's floats (as decode's baseline key holds it). None (kept in memory only)
        without a work folder or for a backend whose baseline is its own run
        (an engine's), not a reusable function of the loaded model."""
        if self.workdir is None or not backend_of(self).capabilities.reusable_baseline:
            return None
        import torch
        import transformers

        from evalkit.models.info import weights_fingerprint

        first = next(lm.model.parameters())
        key = json.dumps(
            [
                FORMAT_VERSION,
                lm.config_hash,
                weights_fingerprint(lm.model),
                str(first.dtype),
                str(first.device),
                torch.__version__,
                transformers.__version__,
                {"batch_size": self.params["batch_size"]},
            ]
        )
        return self.workdir / "retrieval" / f"baseline-{hashlib.sha256(key.encode()).hexdigest()[:24]}.jsonl"

    @staticmethod
    def _sample_key(s: G.Sample) -> str:
        return hashlib.sha256(json.dumps([list(s.ids), s.max_new_tokens]).encode()).hexdigest()

    def baseline(self, lm) -> list[str]:
        if self._baseline is not None:
            return self._baseline
        path = self._baseline_path(lm)
        known: dict[str, str] = {}
        if path is not None and path.is_file():
            for line in path.read_text().splitlines():
                try:
                    rec = json.loads(line)
                except json.JSONDecodeError:
                    continue  # a line cut by an interrupted writer: recomputed below
                known[rec["key"]] = rec["generated"]
        keys = [self._sample_key(s) for s in self.samples]
        missing = [i for i, k in enumerate(keys) if k not in known]
        if missing:
            if path is not None:
                path.parent.mkdir(parents=True, exist_ok=True)

            def save(positions: list[int], texts: list[str]) -> None:  # after every batch: a stopped run resumes
                fresh = {keys[missing[p]]: t for p, t in zip(positions, texts)}
                known.update(fresh)
                if path is not None:
                    append_lines(path, [json.dumps({"key": k, "generated": g}) for k, g in fresh.items()])

            gens = self._generate(lm, Scheme(), missing, on_batch=save)
            known.update({keys[i]: g for i, g in zip(missing, gens)})
        self._baseline = [known[k] for k in keys]
        return self._baseline

    # ---- scoring -----------------------------------------------------------------------------
    def evaluate(self, lm, scheme: Scheme, artifacts: Path | None = None) -> list[MetricRow]:
        self.require_prepared(hasattr(self, "samples"))
        base = self.baseline(lm)
        gens = base if scheme.is_identity else self._generate(lm, scheme)
        frame = self.frame(gens, base)
        rows = stamp(self.rows(frame), backend_of(self))
        if artifacts is not None:
            self.write_artifacts(frame, scheme, Path(artifacts))
        return rows

    def frame(self, gens: list[str], base: list[str]) -> pd.DataFrame:
        recs = []
        for s, g, b in zip(self.samples, gens, base):
            scoring = self.specs[s.task].scoring
            recs.append(
                dict(
                    task=s.task,
                    length=s.length,
                    depth=s.depth,
                    index=s.index,
                    answers=list(s.answers),
                    generated=g,
                    baseline_generated=b,
                    score=score(g, s.answers, scoring),
                    baseline_score=score(b, s.answers, scoring),
                    realised_depth=s.realised_depth,
                )
            )
        return pd.DataFrame.from_records(recs)

    def rows(self, frame: pd.DataFrame) -> list[MetricRow]:
        p = self.params
        info = dict(seed=p["seed"], grid_digest=self.digest[:16])
        levels = [["task", "length", "depth"], ["task", "length"], ["task"], []]
        rows: list[MetricRow] = []
        for level in levels:
            groups = frame.groupby(level, sort=False) if level else [((), frame)]
            for key, g in groups:
                key = key if isinstance(key, tuple) else (key,)
                labels = {k: (int(v) if k == "length" else float(v)) if k != "task" else v for k, v in zip(level, key)}
                used = sorted(
                    {G.haystack_source(self.specs[t], p["haystack"], p["corpus"]) for t in g["task"].unique()}
                )
                where = {
                    **info,
                    "haystack": ", ".join(used),  # what the prompts were cut from, not the parameter
                    "corpus": ", ".join(u for u in used if u != "filler") or None,
                }
                acc, lo, hi, method = accuracy_ci(g["score"].to_numpy())
                extra = dict(n=len(g), ci=method)
                if level:
                    extra["scoring"] = self.specs[g["task"].iloc[0]].scoring if "task" in level else None
                if "depth" in level:
                    extra["realised_depth"] = float(g["realised_depth"].mean())
                rows.append(MetricRow("accuracy", acc, lo, hi, labels, {**where, **extra}))
                d, dlo, dhi = difference_ci(g["score"].to_numpy(), g["baseline_score"].to_numpy())
                rows.append(
                    MetricRow(
                        "accuracy_diff",
                        d,
                        dlo,
                        dhi,
                        labels,
                        {
                            **where,
                            "n": len(g),
                            "ci": difference_method(g["score"].to_numpy(), g["baseline_score"].to_numpy()),
                            "baseline": float(g["baseline_score"].mean()),
                        },
                    )
                )
        return rows

    def write_artifacts(self, frame: pd.DataFrame, scheme: Scheme, folder: Path) -> None:
        from evalkit.evals.retrieval.plots import heatmap

        folder.mkdir(parents=True, exist_ok=True)
        cells = (
            frame.groupby(["task", "length", "depth"], sort=False)
            .agg(value=("score", "mean"), base=("baseline_score", "mean"))
            .reset_index()
        )
        heatmap(cells, folder / "retrieval_accuracy.png", f"retrieval accuracy, {scheme}")
        diff = cells.assign(value=cells["value"] - cells["base"])
        heatmap(diff, folder / "retrieval_diff.png", f"accuracy difference vs baseline, {scheme}", diff=True)
        with open(folder / "samples.jsonl", "w") as fh:
            for rec in frame.to_dict(orient="records"):
                fh.write(json.dumps(rec, sort_keys=True) + "\n")
