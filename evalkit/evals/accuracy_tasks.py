"""The accuracy tasks a grid runs, with what sizing them needs: items, token shapes, baseline accuracy.

:func:`accuracy_tasks` reads a grid's evaluations and lists each accuracy task it runs (a RULER task
once per context length, since each length is a decision of its own) as a :class:`TaskPlan`: the
items the dataset has and the items the grid runs, the prompt and generation tokens of one item, the
kind of task (a key of the discordance priors, ``evalkit.planning.decision.REDRAW_SHARE``) and the baseline
accuracy assumed for Llama-3.1-8B-Instruct, with its source. Sizes are for a Llama-3-style tokenizer.

Three evaluations are read: ``longcontext`` (RULER, LongBench v2, their offline stand-ins), ``lmeval``
(lm-eval's ``mmlu`` and ``gsm8k`` as sized in :mod:`evalkit.evals.lmeval.workload`), and ``generation``
(its reasoning tasks). The dry run's decision table (:mod:`evalkit.planning.decision_sizing`) and the
evaluations' own sizes (``workload``) both read these plans: they live on the evaluations' floor.
"""

from __future__ import annotations

from dataclasses import dataclass

RULER_BASE = {4096: 0.955, 8192: 0.938, 16384: 0.916, 32768: 0.874, 65536: 0.847, 131072: 0.770}
RULER_SOURCE = "RULER's README, Llama3.1 (8B): the 13-task mean at each length"
RULER_DOCS = 500  # lm-eval's RULER generators: num_samples=500 per length
RULER_GEN = {"ruler_vt": 30, "ruler_cwe": 120, "ruler_fwe": 50, "ruler_qa_squad": 32, "ruler_qa_hotpot": 32}
LONGBENCH2 = {"short": (180, 26_000), "medium": (215, 100_000), "long": (108, 127_000)}  # items, prompt tokens
LONGBENCH2_SOURCE = (
    "LongBench v2: 503 items, 180 short (<32k words), 215 medium (32k-128k), 108 long (>128k); prompts at "
    "~1.3 tokens a word, cut to the model's 131,072 (HFLM keeps the last max_length tokens)"
)


@dataclass(frozen=True)
class TaskFacts:
    """One lm-eval task's size and the baseline accuracy assumed for Llama-3.1-8B-Instruct."""

    docs: int
    prompt_tokens: int
    gen_tokens: int  # the task's own max_gen_toks (0: log-likelihood)
    kind: str  # a key of evalkit.planning.decision.REDRAW_SHARE
    baseline: float
    source: str


MRCR_SOURCE = "assumed (no published Llama-3.1-8B-Instruct MRCR score to 128k): graded score, sized as 0/1"

# The reasoning tasks of the `generation` evaluation (evalkit.evals.generation), by lm-eval 0.4.13's names;
# generation_plans() reads its parameters `tasks`, `limit`, `samples` and `max_gen_toks`.
GENERATION_EVAL = "generation"
REASONING_TASKS = {
    "gsm8k_cot_llama": TaskFacts(
        1319, 1500, 1024, "cot", 0.845, "Llama-3.1-8B-Instruct model card: GSM8K (8-shot, CoT) 84.5"
    ),
    "minerva_math500": TaskFacts(
        500, 700, 1024, "cot", 0.50, "model card: MATH (0-shot, CoT) 51.9; MATH-500 is its 500-problem subset"
    ),
    "gpqa_diamond_cot_zeroshot": TaskFacts(
        198, 300, 1024, "cot", 0.30, "model card: GPQA (0-shot, CoT) 30.4 (main set; diamond assumed alike)"
    ),
    "aime24": TaskFacts(30, 150, 32768, "cot", 0.05, "assumed: a few of 30 AIME problems (not on the model card)"),
    "aime25": TaskFacts(30, 150, 32768, "cot", 0.05, "assumed: a few of 30 AIME problems (not on the model card)"),
    # openai/mrcr to 128k (tasks/generation/mrcr.py keeps the items that fit the context, 25 of the 100 in
    # each of the buckets 4k-8k .. 64k-128k), prompts at the buckets' mean (~37k tokens), a graded score in [0, 1]
    # sized as a 0/1 outcome at its mean (its variance is at most p(1-p)); the baselines are assumptions
    "mrcr_2needle": TaskFacts(125, 37_000, 2048, "cot", 0.50, MRCR_SOURCE),
    "mrcr_4needle": TaskFacts(125, 37_000, 2048, "cot", 0.30, MRCR_SOURCE),
}


def generation_plans(params: dict) -> list[TaskPlan]:
    """The ``generation`` evaluation's tasks: ``limit`` items each (all when unset), ``samples`` generations
    per item, at most ``max_gen_toks`` tokens each (the task's own when unset)."""
    plans = []
    for task in params.get("tasks") or ():
        facts = REASONING_TASKS.get(task)
        if facts is None:
            plans.append(TaskPlan(GENERATION_EVAL, task, None))
            continue
        gen = params.get("max_gen_toks") or facts.gen_tokens
        plans.append(
            TaskPlan(
                GENERATION_EVAL,
                task,
                facts,
                planned=min(facts.docs, params.get("limit") or facts.docs),
                gen_tokens=gen,
                samples=int(params.get("samples") or 1),
            )
        )
    return plans


@dataclass(frozen=True)
class TaskPlan:
    """One accuracy decision of a grid: a task (at one length), its facts, what the grid runs of it."""

    eval: str
    task: str
    facts: TaskFacts | None  # None: not sized (a task evalkit has no size for)
    planned: int = 0
    gen_tokens: int = 0
    samples: int = 1
    length: str = ""  # RULER's context length, LongBench v2's length class

    @property
    def label(self) -> str:
        return f"{self.task}@{self.length}" if self.length else self.task


def longcontext_plans(params: dict) -> list[TaskPlan]:
    """RULER: one decision per length, its 13 tasks' items pooled when the group ``ruler`` is asked for, per
    task otherwise; LongBench v2: one decision over its items (a leaf task: a twentieth of them, roughly)."""
    from evalkit.evals.longcontext.tasks import RULER_TASKS

    lengths = params.get("lengths") or [4096]
    plans = []
    for name in params.get("tasks") or ():
        limit = (params.get("limits") or {}).get(name, params.get("limit"))
        if name == "ruler" or name in RULER_TASKS:
            tasks = RULER_TASKS if name == "ruler" else (name,)
            gen = round(sum(RULER_GEN.get(t, 128) for t in tasks) / len(tasks))
            for length in lengths:
                length = int(length)
                base = RULER_BASE.get(length, min(RULER_BASE.values()))
                source = RULER_SOURCE + (f"; the {len(tasks)} tasks' items pooled" if len(tasks) > 1 else "")
                facts = TaskFacts(RULER_DOCS * len(tasks), length - gen, gen, "short_generation", base, source)
                planned = min(RULER_DOCS, limit or RULER_DOCS) * len(tasks)
                plans.append(TaskPlan("longcontext", name, facts, planned, gen, 1, str(length)))
        elif name == "longbench2" or name.startswith("longbench2_"):
            share = 1.0 if name == "longbench2" else 1 / 20
            docs = {c: max(1, round(n * share)) for c, (n, _) in LONGBENCH2.items()}
            prompt = round(sum(docs[c] * tokens for c, (_, tokens) in LONGBENCH2.items()) / sum(docs.values()))
            planned = sum(min(n, limit or n) for n in docs.values())
            source = LONGBENCH2_SOURCE + "; baseline assumed 30 % (chance 25 %)"
            facts = TaskFacts(sum(docs.values()), prompt, 0, "multiple_choice", 0.30, source)
            plans.append(TaskPlan("longcontext", name, facts, planned, 0))
        else:
            plans.append(TaskPlan("longcontext", name, None))
    return plans


MMLU_BASE = 0.694  # model card: MMLU (5-shot) 69.4; lm-eval's `mmlu` is 0-shot


def lmeval_plans(params: dict) -> list[TaskPlan]:
    from evalkit.evals.lmeval.workload import LMEVAL_TASK_SIZES

    plans = []
    for task in params.get("tasks") or ():
        size = LMEVAL_TASK_SIZES.get(task)
        if size is None:
            plans.append(TaskPlan("lmeval", task, None))
            continue
        shots = size.default_shots if params.get("num_fewshot") is None else params["num_fewshot"]
        base, kind, src = (
            (MMLU_BASE, "multiple_choice", "model card: MMLU (5-shot) 69.4")
            if task == "mmlu"
            else (0.845, "cot", "model card: GSM8K (8-shot, CoT) 84.5")
        )
        facts = TaskFacts(size.docs, size.question_tokens + shots * size.shot_tokens, size.gen_tokens, kind, base, src)
        limit = params.get("limit")
        planned = size.docs if limit is None else min(size.docs, limit * size.subtasks)
        plans.append(TaskPlan("lmeval", task, facts, planned, size.gen_tokens))
    return plans


READERS = {"longcontext": longcontext_plans, "lmeval": lmeval_plans, GENERATION_EVAL: generation_plans}


def accuracy_tasks(evals: dict[str, dict]) -> list[TaskPlan]:
    """Every accuracy decision of a grid's evaluations (``{eval name: its validated parameters}``)."""
    return [plan for name, params in evals.items() if name in READERS for plan in READERS[name](params)]
