"""``generation``: long generations under each KV scheme, as the model is served, compared item by item.

    python -m evalkit run --eval generation --generation-tasks gsm8k_cot_llama --generation-max-gen-toks 2048 \\
        --generation-temperature 0.6 --generation-top-p 0.95 --generation-samples 4 \\
        --schemes auto,fp8_e4m3/tensor/dynamic

Public reports of FP8 KV caches hurting models are about long outputs (chain-of-thought maths,
AIME, GPQA): an error stored in the cache is read by every later token, and a changed token changes
the rest of the answer. This evaluation measures that, on the settings operators serve with.

Two workloads, one or both per run:

* ``tasks``: lm-eval ``generate_until`` tasks (evalkit's offline ``evalkit_arith`` in
  ``tasks/generation``, or lm-eval's ``gsm8k_cot_llama``, ``gsm8k_cot_zeroshot``, ``minerva_math500``,
  ``gpqa_diamond_cot_zeroshot``, ``aime24``, ``aime25``...), run through lm-eval with the chat template,
  system prompt, few-shot turns and sampling settings of :mod:`evalkit.evals.generation.serving`, one
  lm-eval run per sample seed. Per item and sample its generated text, extracted answer, correctness
  and length in tokens are kept (:mod:`evalkit.evals.generation.items`);
* ``traces``: an operator's own prompts (a JSONL file, :mod:`evalkit.evals.generation.traces`),
  generated with the same settings on the emulation, and teacher-forced along the baseline's own
  continuation for the decode KL (:mod:`evalkit.evals.generation.trace_decode`).

Baseline. ``prepare`` runs both on the unquantized model (the backend's baseline run: the plain model on
the emulation) and keeps the answers in memory and, where the backend's baseline is reusable, as JSON
under the work folder (``generation/<key>/baseline.json``, reused when weights, tokenizer, parameters,
task files, the traces' content and library versions match). ``evaluate`` runs the scheme and compares
(:mod:`evalkit.evals.generation.rows`; a traces file's: :mod:`~evalkit.evals.generation.trace_rows`):
accuracy, pass@k, the paired accuracy difference, McNemar's
exact test, flips both ways, accuracy by prompt length, first divergence, the failure gates (repeated
tokens and n-grams, first-token EOS, collapse to one token, runaway, invalid UTF-8:
:mod:`evalkit.evals.generation.gates`), and for traces the decode KL. An identity scheme reproduces the
baseline bit for bit: no flip, no divergence, no gate fires, KL 0.
MRCR tasks (``mrcr_standin``, ``mrcr_2needle``, ``mrcr_4needle``) add pass@1 per length bucket, the AUC
across lengths and the % recovery against the baseline (:mod:`evalkit.evals.generation.mrcr`).

With ``prefix_cache_hit`` the task prompts are served with prefix caching, as vLLM does by default: each
prompt reads the 16-token blocks it shares with an earlier prompt (the chat template, system prompt and
few-shot turns) from the quantized cache, and the rest of it is a continuation chunk over them
(:mod:`evalkit.evals.lmeval.prefix_hits`); the baseline is served the same way, and the rows say so
(``info["prefill"]``: how many requests hit, and how many tokens on average).

Per-item answers of every run go to its artifacts as ``generation_items.json`` (JSON, no pickle). The
report shows each task's accuracy, its paired change and flips (:mod:`evalkit.evals.generation.report`),
``report --max-task-drop 0.01`` budgets the accuracy drop per task at 95 %, and ``report --max-failure-rate
0.01`` the share of item-samples on which a failure gate fires. ``report --plots`` draws accuracy and the
failure-gate rates by prompt length (:mod:`evalkit.evals.generation.plots`).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, ClassVar

from evalkit.errors import EvalkitError
from evalkit.evals.backend import LmevalRequest, backend_of, stamp
from evalkit.evals.base import Criterion, Evaluation, MetricRow, ReportSpec, register_eval
from evalkit.evals.generation.params import TRACE_BUDGET, GenerationParams, file_identity, gen_kwargs, tasks_dir

BASELINE_FORMAT = 3  # bump when the cached baseline's contents change shape (2: traces keep split_tokens; 3: graded scores per sample)


@register_eval("generation")
class GenerationEval(Evaluation):
    grows = "limit"
    numerics_version = 2  # 1: Tango / design-effect intervals, the item as the unit, by-length on prompt length;
    # 2: failure-gate rows (fail_<gate>, fail_any, by length), the baseline's interval in accuracy_by_length
    request = "lmeval"  # its tasks through lm-eval's model (its traces need the emulation: it says so itself)
    Params = GenerationParams
    summary_metrics: ClassVar[tuple[str, ...]] = ()
    report = ReportSpec(
        frames=("evalkit.evals.generation.report:frame",),
        displays=("evalkit.evals.generation.report:display",),
        notes=("evalkit.evals.generation.report:notes",),
        criteria=(
            Criterion(
                "{task} accuracy",
                "*/gen_acc_delta",
                "max_task_drop",
                True,
                "{task} accuracy drop",
                unit=" pts",
                digits=1,
                transform="neg",
            ),
            Criterion(
                "{task} failures",
                "*/gen_fail_any",
                "max_failure_rate",
                True,
                "{task} failure rate",
                unit="%",
                digits=1,
            ),
        ),
        plots=("evalkit.evals.generation.plots:generation_figures",),
        order=45,
    )

    @classmethod
    def workload(cls, params: dict[str, Any], facts, device: str = "cpu"):
        from evalkit.evals.generation.workload import generation_work

        return generation_work(params, facts, device)

    def canonical_params(self) -> dict[str, Any]:
        """The parameters, the traces file by its name and content rather than where it lies; without
        ``prefix_cache_hit`` while it is off: runs made before it existed keep their ids."""
        p = dict(self.params)
        if p["traces"] is not None:
            p["traces"] = file_identity(p["traces"])
        if not p["prefix_cache_hit"]:
            del p["prefix_cache_hit"]
        return p

    # ---- per model --------------------------------------------------------------------------

    def prepare(self, lm, workdir: Path) -> None:
        from evalkit.evals.generation.serving import check_model, check_task_types, offline_own

        p = self.params
        check_model(lm, p)
        backend = backend_of(self)
        if p["traces"] is not None and backend.capabilities.kl != "estimate":
            raise EvalkitError(
                f"generation traces score the decode KL from full next-token distributions, which backend "
                f"{backend.name} does not return: run the traces with --engine emulation (tasks run on both)"
            )
        self.gen_kwargs = gen_kwargs(p)
        if p["tasks"]:
            from evalkit.evals.lmeval.adapter import resolve_tasks

            metadata = {"pretrained": str(lm.path)}
            self._tasks = offline_own(resolve_tasks(p["tasks"], (str(tasks_dir()), *p["include"]), metadata))
            check_task_types(self._tasks)
            if p["prefix_cache_hit"] and not backend.capabilities.cache_reuse:
                raise EvalkitError(
                    f"--generation-prefix-cache-hit is modelled on the emulation; backend {backend.name} serves with "
                    "its own prefix cache: drop the flag or use --engine emulation"
                )
            self.request = LmevalRequest(batch_size=p["batch_size"], prefix_cache_hit=p["prefix_cache_hit"])
            backend.prepare_lmeval(self.request, lm)
        if p["traces"] is not None:
            self._prepare_traces(lm)
        self._model = lm.model
        if not backend.capabilities.reusable_baseline:
            self.baseline = self._run(lm, None)
        else:
            from evalkit.evals.lmeval import baseline_cache as cache
            from evalkit.evals.lmeval.adapter import include_paths

            folders = include_paths((str(tasks_dir()), *p["include"]))
            key = cache.baseline_key(lm, format=BASELINE_FORMAT, params=self.canonical_params(), task_folders=folders)
            path = cache.baseline_file(workdir, "generation", key)
            self.baseline = cache.read_baseline(path, key, {"tasks": dict, "task_info": dict, "traces": list})
            if self.baseline is None:
                self.baseline = self._run(lm, None)
                cache.write_baseline(path, key, self.baseline)
        if p["traces"] is not None:
            from evalkit.evals.generation.trace_decode import check_memory, teacher_forced
            from evalkit.kv.scheme import Scheme

            first = [samples[0]["ids"] for samples in (r["samples"] for r in self.baseline["traces"])]
            check_memory(first)
            self._summaries = teacher_forced(lm, self._head, Scheme(), self._prompts, first)

    def _prepare_traces(self, lm) -> None:
        from evalkit.evals.generation.traces import prompt_ids, read_traces
        from evalkit.evals.output_head import OutputHead

        p = self.params
        self._traces = read_traces(p["traces"])
        self._prompts = [prompt_ids(t, lm.tokenizer, p["chat_template"], p["system_prompt"]) for t in self._traces]
        self._budget = p["max_gen_toks"] or TRACE_BUDGET
        longest = max(len(x) for x in self._prompts)
        if lm.max_length is not None and longest + self._budget > lm.max_length:
            line = self._traces[max(range(len(self._prompts)), key=lambda k: len(self._prompts[k]))].line
            raise EvalkitError(
                f"traces line {line} has {longest} prompt tokens, with the output budget {self._budget} over "
                f"{lm.name}'s context of {lm.max_length}: lower --generation-max-gen-toks or shorten the prompt"
            )
        self._head = OutputHead(lm.model, "generation")

    def _run(self, lm, scheme) -> dict:
        """Both workloads under ``scheme`` (None: the baseline run): task items, task info, trace records."""
        from evalkit.evals.generation.serving import run_samples, seeds

        out: dict = {"tasks": {}, "task_info": {}, "traces": []}
        p = self.params
        if p["tasks"]:
            with backend_of(self).lmeval_model(self.request, lm, scheme) as model:
                self._batch_size = model.batch_size
                out["tasks"], out["task_info"] = run_samples(model, self._tasks, p, self.gen_kwargs, lm.tokenizer)
            if p["prefix_cache_hit"]:
                self._hits = list(model.last_hits or [])
        if p["traces"] is not None:
            from evalkit.evals.generation.trace_decode import generate
            from evalkit.evals.generation.trace_rows import trace_records

            gens = generate(lm, scheme, self._prompts, self._budget, self.gen_kwargs, seeds(p))
            out["traces"] = trace_records(self._traces, lm.tokenizer, gens, seeds(p), self._budget)
        return out

    # ---- per scheme -------------------------------------------------------------------------

    def evaluate(self, lm, scheme, artifacts: Path | None = None) -> list[MetricRow]:
        from evalkit.evals.generation.mrcr import mrcr_rows
        from evalkit.evals.generation.rows import task_rows
        from evalkit.evals.generation.serving import settings_info
        from evalkit.evals.generation.trace_rows import trace_rows
        from evalkit.evals.lmeval.prefix_hits import hits_note

        self.require_prepared(hasattr(self, "_model") and self._model is lm.model)  # lm.model: None for an engine
        p = self.params
        run = self._run(lm, scheme)
        info = settings_info(p, self.gen_kwargs)
        if p["tasks"]:
            info["batch_size"] = self._batch_size
        if p["prefix_cache_hit"]:
            info["prefill"] = hits_note(self._hits)
        task_info = {t: {**info, **v} for t, v in run["task_info"].items()}
        rows = task_rows(self.baseline["tasks"], run["tasks"], lm.tokenizer, task_info)
        rows += mrcr_rows(self.baseline["tasks"], run["tasks"], lm.tokenizer, task_info)
        kl = None
        if p["traces"] is not None:
            from evalkit.evals.generation.trace_decode import teacher_forced

            first = [r["samples"][0]["ids"] for r in self.baseline["traces"]]
            kl = teacher_forced(lm, self._head, scheme, self._prompts, first, self._summaries)
            trace_info = {**info, "file": file_identity(p["traces"]), "max_gen_toks": self._budget}
            rows += trace_rows(self.baseline["traces"], run["traces"], kl, trace_info, [len(x) for x in self._prompts])
            for record, k in zip(run["traces"], kl):
                record.update(kl_mean=float(k["kl"].mean()), top1_agreement=float(k["agree"].mean()))
        if artifacts is not None:
            folder = Path(artifacts)
            folder.mkdir(parents=True, exist_ok=True)
            (folder / "generation_items.json").write_text(
                json.dumps({"scheme": str(scheme), "settings": info, **run}, indent=None)
            )
        return stamp(rows, backend_of(self))
