"""generation: its inputs (the traces file, line by line; the parameters and their one-line refusals), the
run id of a traces file by content, the shipped task's data, and that the existing evaluations' run specs
did not move (the published stores' recorded specs are this code's)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from evalkit.errors import EvalkitError
from evalkit.evals.base import get_eval
from evalkit.evals.generation.traces import matches_reference, read_traces

ROOT = Path(__file__).resolve().parents[2]


def write(tmp_path, *lines: str) -> Path:
    path = tmp_path / "t.jsonl"
    path.write_text("\n".join(lines) + "\n")
    return path


def test_the_example_traces_file_reads():
    traces = read_traces(ROOT / "tasks" / "generation" / "example_traces.jsonl")
    assert [t.line for t in traces] == [1, 2, 3]
    assert traces[0].prompt and traces[0].reference == "7" and traces[2].reference is None
    assert [m["role"] for m in traces[1].messages] == ["system", "user"]
    # the evaluation's system prompt goes first only where the chat has none
    assert traces[0].chat("Be brief.")[0] == {"role": "system", "content": "Be brief."}
    assert traces[1].chat("Be brief.")[0]["content"] == "You answer in one short sentence."


@pytest.mark.parametrize(
    "bad,problem",
    [
        ('{"prompt": "a"', "line 2: not valid JSON"),
        ('["prompt"]', "line 2: a JSON list, not an object"),
        ('{"prompt": "a", "refrence": "b"}', "line 2: unknown field 'refrence'"),
        ('{"reference": "b"}', "line 2: give exactly one of prompt"),
        ('{"prompt": "a", "messages": [{"role": "user", "content": "b"}]}', "line 2: give exactly one of prompt"),
        ('{"prompt": "  "}', "line 2: prompt must be a non-empty string"),
        ('{"messages": []}', "line 2: messages must be a non-empty list"),
        ('{"messages": [{"role": "bot", "content": "b"}]}', "line 2: messages[0] has role 'bot'"),
        ('{"messages": [{"role": "user"}]}', "line 2: messages[0] must be an object with exactly role and content"),
        (
            '{"messages": [{"role": "user", "content": "a"}, {"role": "assistant", "content": "b"}]}',
            "line 2: messages end with the assistant",
        ),
        ('{"prompt": "a", "reference": true}', "line 2: reference must be"),
    ],
)
def test_a_bad_line_is_named_by_its_number(tmp_path, bad, problem):
    path = write(tmp_path, '{"prompt": "fine"}', bad)
    with pytest.raises(EvalkitError) as err:
        read_traces(path)
    assert problem in str(err.value) and str(path) in str(err.value) and "\n" not in str(err.value)


def test_empty_and_missing_files(tmp_path):
    with pytest.raises(EvalkitError, match="holds no prompts"):
        read_traces(write(tmp_path, "", "  "))
    with pytest.raises(EvalkitError, match="does not exist"):
        read_traces(tmp_path / "nope.jsonl")


def test_a_bad_traces_file_fails_at_the_parameters(tmp_path):
    """The parameters check the file, so a grid or `run` refuses it before a model loads."""
    path = write(tmp_path, '{"prompt": "a"}', '{"prompt": "b"', '{"prompt": "c"}')
    with pytest.raises(EvalkitError, match=r"line 2: not valid JSON"):
        get_eval("generation")({"traces": str(path), "tasks": "none"})


@pytest.mark.parametrize(
    "text,reference,expected",
    [
        ("The answer is 7.", "7", True),
        ("It is 17", "7", False),
        ("paris is the capital", "Paris", True),
        ("Parisian", "Paris", False),
        ("New   York!", "new york", True),
    ],
)
def test_reference_matches_a_whole_phrase(text, reference, expected):
    assert matches_reference(text, reference) is expected


@pytest.mark.parametrize(
    "params,message",
    [
        ({"samples": 2}, "at temperature 0 repeat one greedy answer"),
        ({"top_p": 0.9}, "top_p applies to sampling only"),
        ({"temperature": -1}, "temperature must be at least 0"),
        ({"temperature": 0.7, "top_p": 1.5}, "top_p must be above 0 and at most 1"),
        ({"chat_template": False, "fewshot_as_multiturn": True}, "fewshot_as_multiturn needs the chat template"),
        ({"tasks": "none"}, "needs tasks or traces"),
        ({"tasks": "gsm8k_cot_lama"}, "unknown lm-eval task 'gsm8k_cot_lama'"),
        ({"max_gen_toks": 0}, "max_gen_toks = 0 is too small"),
    ],
)
def test_bad_parameters_are_one_line(params, message):
    with pytest.raises(EvalkitError) as err:
        get_eval("generation")(params)
    assert message in str(err.value) and "\n" not in str(err.value)


def test_settings_are_in_the_canonical_params_and_a_traces_file_by_content(tmp_path):
    path = write(tmp_path, '{"prompt": "a"}')
    params = {
        "traces": str(path),
        "temperature": 0.6,
        "top_p": 0.95,
        "samples": 4,
        "max_gen_toks": 1024,
        "system_prompt": "Be brief.",
    }
    ev = get_eval("generation")(params)
    canon = ev.canonical_params()
    assert canon["traces"]["name"] == "t.jsonl" and len(canon["traces"]["sha256"]) == 64
    assert str(tmp_path) not in json.dumps(canon)  # where the file lies is not in the run id
    for key in ("temperature", "top_p", "samples", "max_gen_toks", "system_prompt"):
        assert canon[key] == params[key]
    assert canon["chat_template"] is True and canon["fewshot_as_multiturn"] is True
    before = canon["traces"]["sha256"]
    path.write_text('{"prompt": "b"}\n')
    assert get_eval("generation")(params).canonical_params()["traces"]["sha256"] != before


def test_a_model_without_a_chat_template_is_refused_in_one_line(tiny):
    from evalkit.evals.generation.serving import check_model

    assert not getattr(tiny.tokenizer, "chat_template", None)
    p = get_eval("generation")({}).params
    with pytest.raises(EvalkitError) as err:
        check_model(tiny, p)
    assert "has no chat template: pass --no-generation-chat-template" in str(err.value)
    check_model(tiny, {**p, "chat_template": False})  # plain text: accepted
    with pytest.raises(EvalkitError, match="is not below .* context of 512 tokens"):
        check_model(tiny, {**p, "chat_template": False, "max_gen_toks": 512})


def test_the_shipped_task_data():
    data = json.loads((ROOT / "tasks" / "generation" / "arith.json").read_text())
    assert len(data["test"]) == 8 and len(data["train"]) == 3
    for doc in data["test"]:
        assert doc["answer"].isdigit() and doc["question"].endswith("?")
    for doc in data["train"]:  # each solved example ends with its answer, the form the prompt asks for
        assert doc["solution"].rsplit("The answer is ", 1)[1].isdigit()


@pytest.mark.parametrize("store", ["default", "engine", "llamacpp", "vllm-dtypes"])
def test_existing_evaluations_keep_their_run_specs(store):
    """Every run a published store recorded has the same canonical spec under this code (the parameters
    hashed into its run id): the generation evaluation and its budget moved no existing evaluation's params.
    (The run id also holds the code identity, which any new module changes by design.)"""
    from evalkit.sweep.grid import parse_grid
    from evalkit.sweep.spec import RunSpec, canonical_json

    folder = ROOT / "published" / store
    recorded = {}
    for line in (folder / "results.jsonl").read_text().splitlines():
        record = json.loads(line)
        if record.get("type") == "complete" and record.get("spec"):
            recorded[record["run_id"]] = canonical_json(RunSpec.from_dict(record["spec"]).canonical())
    grid = parse_grid(folder / "grid.yaml")
    ours = {canonical_json(r.canonical()) for r in grid.runs}
    assert recorded and set(recorded.values()) <= ours


def test_a_task_of_another_output_type_is_refused_before_it_runs():
    from evalkit.evals.generation.params import tasks_dir
    from evalkit.evals.generation.serving import check_task_types
    from evalkit.evals.lmeval.adapter import resolve_tasks

    check_task_types(resolve_tasks(["evalkit_arith"], (str(tasks_dir()),)))
    with pytest.raises(EvalkitError, match=r"not evalkit_mmlu4 \(multiple_choice\): run those with --eval lmeval"):
        check_task_types(resolve_tasks(["evalkit_mmlu4", "evalkit_arith"], (str(tasks_dir()),)))


def test_samples_are_seeded_per_request_where_the_model_takes_a_seed():
    """lm-eval's transformers model draws from torch's generator (seeded by simple_evaluate; top_k off, as a
    server's request); a model taking a seed per request (lm-eval's vLLM model) gets it in gen_kwargs."""
    from evalkit.evals.generation.serving import evaluate_options, takes_request_seed
    from evalkit.evals.lmeval.batching import hflm_class

    p = get_eval("generation")({"temperature": 0.6, "top_p": 0.9, "samples": 2, "system_prompt": "Hi."}).params
    kwargs = {"do_sample": True, "temperature": 0.6, "top_p": 0.9}
    assert not takes_request_seed(hflm_class(quiet=True).__new__(hflm_class(quiet=True)))

    class RequestSeeded:  # stands for lm_eval.models.vllm_causallms.VLLM, absent here
        pass

    assert takes_request_seed(RequestSeeded())
    hf = evaluate_options(p, kwargs, 7, request_seed=False)
    assert hf["gen_kwargs"] == {**kwargs, "top_k": 0} and hf["torch_random_seed"] == 7
    assert (
        hf["apply_chat_template"] is True and hf["system_instruction"] == "Hi." and hf["fewshot_as_multiturn"] is True
    )
    assert evaluate_options(p, kwargs, 7, request_seed=True)["gen_kwargs"] == {**kwargs, "seed": 7}
    greedy = {"do_sample": False, "temperature": 0.0}
    assert evaluate_options(p, greedy, 7, request_seed=True)["gen_kwargs"] == greedy


def test_evalkits_own_generation_tasks_need_no_network():
    from evalkit.evals.generation.params import tasks_dir
    from evalkit.evals.generation.serving import offline_own
    from evalkit.evals.lmeval.adapter import resolve_tasks

    tasks = resolve_tasks(["evalkit_arith"], (str(tasks_dir()),))
    assert tasks.external == ("evalkit_arith",)  # not one of tasks/lmeval's
    assert offline_own(tasks).external == ()  # its data lie beside its YAML: no hub probe
