"""What one run of a sweep will process, computed from its parameters without running it.

``evalkit sweep --dry-run`` sizes a grid before any model work (:mod:`evalkit.sweep.estimate`).
Per evaluation, :func:`workload` returns a :class:`Work`: the forward calls one scheme's pass makes
(batched prefills and one-token decode steps, with the context they attend to), the tokens they
process, the baseline pass (once per model x evaluation, as the evaluations cache it), and the
disk its baseline cache and its results take. Counts follow each evaluation's own protocol:

* perplexity: the window plan of :func:`evalkit.evals.perplexity.evaluation.plan_windows` over the corpus,
  tokenized with the model's tokenizer when both are on this machine (exact); otherwise the
  corpus's known token count (:data:`WIKITEXT2_TEST_TOKENS`) or ~4 characters per token
  (approximate). Tokens = windows x window (every window is forwarded whole).
* retrieval: tasks x lengths x depths x samples prompts of exactly ``length`` tokens, plus each
  sample's answer budget (the evaluation's own ``max_new_tokens`` rule on the seeded answers);
  the bf16 run reuses the baseline's answers.
* decode: 2 x sequences rows (teacher-forced and free-running) of prefill + decode tokens.
* lmeval: evalkit's offline tasks (``tasks/lmeval``) by building lm-eval's requests and
  tokenizing them; lm-eval's built-in tasks whose data is not here from :data:`LMEVAL_TASK_SIZES`
  (documented sizes, approximate). One-token answer choices share one forward per question, as
  lm-eval's HFLM computes them; generation counts its full ``max_gen_toks`` budget (an upper bound).

Disk: baselines store :data:`~evalkit.evals.kl_topk.BYTES_PER_POSITION` (2008) bytes per scored
token (perplexity) or per decoded position (decode); result rows and per-run artifacts are sized
from the published default sweep (:data:`ROW_BYTES` and the per-item sizes below).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from evalkit.evals.kl_topk import BYTES_PER_POSITION

CHARS_PER_TOKEN = 4.0  # English prose, when no tokenizer is here (GPT-2/Llama-3 tokenizers: 4-4.5)
ROW_BYTES = 1100  # one results.jsonl row with its info (published/default: 1.09 MB / 1040 rows)
LMEVAL_ROW_BYTES = 2500  # lm-eval rows carry the task config in their info
AUTO_BATCH_ASSUMED = 32  # lm-eval's batch size "auto" searches down from 64 on the device: 32 assumed

# wikitext-2-raw-v1 test split, tokens of the whole split (no special tokens), per tokenizer family.
# gpt2: 287,644 (Hugging Face transformers docs, "Perplexity of fixed-length models");
# llama-2 (32k SentencePiece): ~341k (GPTQ/Wanda-style evaluations cut it into 83 windows of 4096
# and 166 of 2048); llama-3 (128k tiktoken BPE): ~289k (140-141 windows of 2048 in the same
# evaluations). Rows of the evalkit corpus are joined as they are, as in those counts.
WIKITEXT2_TEST_TOKENS = {"gpt2": 287_644, "llama-2": 341_000, "llama-3": 289_000}
WIKITEXT2_TEST_CHARS = 1_288_556  # characters of the raw test split (for other tokenizers, / CHARS_PER_TOKEN)


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


@dataclass(frozen=True)
class Forwards:
    """``calls`` forward calls of ``rows`` sequences x ``length`` new tokens, each row attending to
    ``context`` tokens already cached (a mean over the calls)."""

    calls: int
    rows: int
    length: int
    context: float = 0.0

    @property
    def tokens(self) -> int:
        return self.calls * self.rows * self.length


@dataclass(frozen=True)
class Work:
    """What one run of an evaluation processes, and what it stores."""

    eval: str
    tokens: int  # tokens one scheme's pass processes
    forwards: tuple[Forwards, ...]  # one scheme's pass
    baseline: tuple[Forwards, ...] = ()  # once per model x evaluation (cached afterwards)
    identity_is_baseline: bool = False  # the bf16 run reuses the baseline pass (retrieval)
    baseline_bytes: int = 0  # baseline cache, once per model x evaluation (under the cache folder)
    cache_bytes: int = 0  # other caches (tokenized corpus), once per model x evaluation
    store_bytes: int = 0  # results rows and artifacts of one run (under the output folder)
    approximate: str = ""  # why the counts are approximate ("" when exact)
    notes: tuple[str, ...] = field(default_factory=tuple)

    @property
    def baseline_tokens(self) -> int:
        return self.tokens if self.baseline else 0  # the baseline pass runs the same inputs


def _batches(n: int, batch: int) -> list[tuple[int, int]]:
    """(calls, rows) groups covering n rows in batches of ``batch`` (the last one may be smaller)."""
    full, rest = divmod(n, batch)
    return [(c, r) for c, r in ((full, batch), (1 if rest else 0, rest)) if c]


def _count_tokens(tokenizer, text: str) -> int:
    if tokenizer is None:
        return max(1, round(len(text) / CHARS_PER_TOKEN))
    return len(tokenizer(text, add_special_tokens=False, verbose=False)["input_ids"])


# ---- perplexity --------------------------------------------------------------------------------
def _corpus_tokens(spec: str, facts) -> tuple[int, bool | None, str]:
    """(tokens in the corpus, whether the tokenizer adds BOS or None if unknown, why approximate)."""
    from evalkit.data.corpus import SHORT_NAMES, load_corpus, tokenizer_adds_bos
    from evalkit.errors import EvalkitError
    from evalkit.evals.lmeval.adapter import offline_datasets

    tok = facts.tokenizer
    try:
        with offline_datasets(True):  # a dry run never downloads: a corpus not here is sized from its known count
            corpus = load_corpus(spec)
    except (EvalkitError, ImportError):
        corpus = None
    bos = tokenizer_adds_bos(tok) if tok is not None else None
    if corpus is not None and tok is not None:
        return _count_tokens(tok, corpus.text), bos, ""
    if corpus is not None:
        return _count_tokens(None, corpus.text), bos, f"corpus {spec} at ~{CHARS_PER_TOKEN:g} characters per token (no tokenizer here)"
    if SHORT_NAMES.get(spec.strip().lower(), spec) == SHORT_NAMES["wikitext2"]:
        name = facts.name.lower()
        family = next((f for f in ("llama-3", "llama-2", "gpt2") if f in name or f.replace("-", "") in name), None)
        if family is None and facts.vocab:
            family = {128256: "llama-3", 32000: "llama-2", 50257: "gpt2"}.get(facts.vocab)
        if family:
            return WIKITEXT2_TEST_TOKENS[family], bos, f"wikitext-2 test not cached here: ~{WIKITEXT2_TEST_TOKENS[family]:,} tokens ({family} tokenizer)"
        n = round(WIKITEXT2_TEST_CHARS / CHARS_PER_TOKEN)
        return n, bos, f"wikitext-2 test not cached here: ~{n:,} tokens at ~{CHARS_PER_TOKEN:g} characters per token"
    raise EvalkitError(f"corpus {spec!r} is not on this machine and its size is unknown: cannot size the perplexity runs")


def perplexity_work(params: dict, facts) -> Work:
    from evalkit.evals.perplexity.evaluation import plan_windows, position_bucket_edges

    n, bos, approx = _corpus_tokens(params["corpus"], facts)
    if bos is None:
        bos = True  # Llama-family tokenizers add BOS
    if params["max_tokens"] is not None:
        n = min(n, params["max_tokens"])
    window = params["window"]
    if facts.max_length is not None and window > facts.max_length:
        from evalkit.errors import EvalkitError

        raise EvalkitError(f"perplexity window {window} is longer than {facts.name}'s maximum {facts.max_length}")
    plan = plan_windows(n, window, params["stride"], bos, params["max_windows"])
    scored = sum(window - t0 for _, t0 in plan)
    fw = tuple(Forwards(c, r, window) for c, r in _batches(len(plan), params["batch_size"]))
    rows = 7 * len(position_bucket_edges(window))  # 7 metrics, overall and per bucket
    return Work("perplexity", len(plan) * window, fw, baseline=fw, baseline_bytes=scored * BYTES_PER_POSITION + 8 * len(plan),
                cache_bytes=4 * n, store_bytes=rows * ROW_BYTES + 90 * len(plan), approximate=approx)


# ---- retrieval ---------------------------------------------------------------------------------
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
                    budgets.append(G.sample_needles(task, params["seed"], length, depth, i,
                                                    lambda text: _count_tokens(facts.tokenizer, text))[2])
            prompts += len(budgets)
            tokens += len(budgets) * length + sum(budgets)
            bs = params["batch_size"]
            for j in range(0, len(budgets), bs):  # batches of one (task, length), as the evaluation groups them
                batch = budgets[j: j + bs]
                steps = max(batch)
                fw.append(Forwards(1, len(batch), length))
                if steps > 1:
                    fw.append(Forwards(steps - 1, len(batch), 1, length + steps / 2))
    cells = len(specs) * len(lengths) * len(params["depths"])
    rows = 2 * (cells + len(specs) * len(lengths) + len(specs) + 1)
    approx = "" if facts.tokenizer is not None else "answer lengths at ~4 characters per token (no tokenizer here)"
    fw_t = tuple(fw)
    return Work("retrieval", tokens, fw_t, baseline=fw_t, identity_is_baseline=True, baseline_bytes=200 * prompts,
                store_bytes=rows * ROW_BYTES + 400 * prompts + 80_000, approximate=approx)


# ---- decode ------------------------------------------------------------------------------------
def decode_work(params: dict, facts) -> Work:
    from evalkit.evals.decode.evaluation import DecodeParams, step_bucket_edges

    p = DecodeParams(**params)
    rows = 2 * p.sequences
    fw: list[Forwards] = []
    for calls, r in _batches(rows, p.batch_size):
        fw.append(Forwards(calls, r, p.prefill))
        if p.decode > 1:
            fw.append(Forwards(calls * (p.decode - 1), r, 1, p.prefill + p.decode / 2))
    n_rows = 5 * len(step_bucket_edges(p.decode, p.buckets)) + 2
    fw_t = tuple(fw)
    return Work("decode", rows * p.length, fw_t, baseline=fw_t,
                baseline_bytes=rows * p.decode * BYTES_PER_POSITION + 8 * rows * p.length,
                store_bytes=n_rows * ROW_BYTES + 84 * rows * p.decode)


# ---- lm-eval -----------------------------------------------------------------------------------
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
                n_cont = _count_tokens(facts.tokenizer, cont)
                key = (context, cont if n_cont > 1 else "")  # one-token continuations share the context's forward
                out.chars += len(context) + len(cont)
                if key not in seen:
                    seen.add(key)
                    out.loglik.append(min(max_length, _count_tokens(facts.tokenizer, context) + n_cont))
            elif kind == "loglikelihood_rolling":
                n = _count_tokens(facts.tokenizer, inst.args[0])
                out.chars += len(inst.args[0])
                out.loglik += [max_length] * (n // max_length) + ([n % max_length] if n % max_length else [])
            else:  # generate_until
                context, kwargs = inst.args[0], inst.args[1]
                out.chars += len(context)
                out.gen.append((_count_tokens(facts.tokenizer, context), int(kwargs.get("max_gen_toks", 256))))
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
        batch = AUTO_BATCH_ASSUMED
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
        rows = loglik[j: j + batch]
        fw.append(Forwards(1, len(rows), max(rows)))
    gen = sorted(reqs.gen, reverse=True)
    for j in range(0, len(gen), batch):
        rows = gen[j: j + batch]
        prompt, steps = max(r[0] for r in rows), max(r[1] for r in rows)
        fw.append(Forwards(1, len(rows), prompt))
        fw.append(Forwards(steps, len(rows), 1, prompt + steps / 2))
    tokens = sum(reqs.loglik) + sum(p + g for p, g in reqs.gen)
    rows_out = reqs.leaves * 8 + 4 * len(params["tasks"])
    store = rows_out * LMEVAL_ROW_BYTES + reqs.chars + 600 * reqs.items  # lmeval_samples.json repeats the prompts
    fw_t = tuple(fw)
    return Work("lmeval", tokens, fw_t, baseline=fw_t, baseline_bytes=reqs.chars + 900 * reqs.items,
                store_bytes=store, approximate="; ".join(approx))


def workload(eval_name: str, params: dict, facts, device: str = "cpu") -> Work:
    """The :class:`Work` of one run; a :class:`Work` with no forwards for evaluations it does not know."""
    if eval_name == "perplexity":
        return perplexity_work(params, facts)
    if eval_name == "retrieval":
        return retrieval_work(params, facts)
    if eval_name == "decode":
        return decode_work(params, facts)
    if eval_name == "lmeval":
        return lmeval_work(params, facts, device)
    return Work(eval_name, 0, (), approximate=f"evalkit cannot size eval {eval_name!r}: counted as 0")

