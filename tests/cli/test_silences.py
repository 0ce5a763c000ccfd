"""What used to pass in silence is one line now: an empty --schemes, a grid naming a model folder or
a corpus file that does not exist, a bad corpus spec before a model loads, Ctrl-C (which says how to
resume), lm-eval's chatter (in the run's log, not on the terminal), and the flip rate's parts."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from evalkit.cli import main
from evalkit.errors import EvalkitError

from tests.cli_checks import one_line_exit_2

REPO = Path(__file__).resolve().parents[2]
SCHEME = "fp8_e4m3/tensor/dynamic"


@pytest.fixture
def no_model_loads(monkeypatch):
    """Loading (or converting) a model fails the test: the check must come first."""
    import evalkit.models.loading

    def refuse(*args, **kwargs):
        raise AssertionError("a model was loaded before the input was checked")

    monkeypatch.setattr(evalkit.models.loading, "load_model", refuse)
    monkeypatch.setattr(evalkit.models.loading, "ensure_embedded", refuse)


# -- an empty scheme list ---------------------------------------------------------------------
@pytest.mark.parametrize("schemes", ["", " "])
def test_empty_schemes_are_refused_before_anything_runs(schemes, tmp_path, capsys, no_model_loads):
    one_line_exit_2(
        ["run", "--schemes", schemes, "--out", str(tmp_path / "out"), "--cache-dir", str(tmp_path / "c")],
        capsys,
        "--schemes",
        "names no scheme",
        "the auto baseline is always added",
    )
    assert not (tmp_path / "out").exists()


def grid_file(
    tmp_path: Path,
    models: str = "[embedded]",
    schemes: str = f"[{SCHEME}]",
    evals: str = "{perplexity: {window: 64, max_windows: 1}}",
) -> Path:
    path = tmp_path / "grid.yaml"
    path.write_text(f"name: t\nmodels: {models}\nschemes: {schemes}\nevals: {evals}\n")
    return path


@pytest.mark.parametrize("schemes", ['""', '[""]', "[]"])
def test_a_grid_with_no_scheme_is_refused(schemes, tmp_path):
    from evalkit.sweep.grid import GridError, parse_grid

    with pytest.raises(GridError, match=r"grid\.yaml:3: schemes"):
        parse_grid(grid_file(tmp_path, schemes=schemes))


# -- a grid naming what does not exist ----------------------------------------------------------
def test_a_grid_model_folder_that_does_not_exist_is_a_grid_problem(tmp_path):
    from evalkit.sweep.grid import GridError, parse_grid

    missing = tmp_path / "no-such-model"
    with pytest.raises(GridError) as exc:
        parse_grid(grid_file(tmp_path, models=f"[embedded, {{name: {missing}}}, ./not-here]"))
    problems = exc.value.problems
    assert len(problems) == 2
    assert problems[0].startswith(f"{tmp_path / 'grid.yaml'}:2: models[1].name: no such folder: {missing}")
    assert "models[2]: no such folder: ./not-here" in problems[1]


def test_an_existing_model_folder_and_hub_ids_pass(tmp_path):
    from evalkit.sweep.grid import parse_grid

    folder = tmp_path / "model"
    folder.mkdir()
    grid = parse_grid(grid_file(tmp_path, models=f"[{folder}, some-org/some-model]"))
    assert {r.model.name for r in grid.runs} == {
        str(folder),
        "some-org/some-model",
    }  # the hub id is the loader's to check


def test_a_grid_corpus_file_that_does_not_exist_is_a_grid_problem(tmp_path):
    from evalkit.sweep.grid import GridError, parse_grid

    evals = "{perplexity: {corpus: 'file:gone.txt'}, retrieval: {haystack: 'file:gone.jsonl', samples: 1}}"
    with pytest.raises(GridError) as exc:
        parse_grid(grid_file(tmp_path, evals=evals))
    assert len(exc.value.problems) == 2
    assert "evals.perplexity.corpus: corpus file 'gone.txt' does not exist" in exc.value.problems[0]
    assert "evals.retrieval.haystack: corpus file 'gone.jsonl' does not exist" in exc.value.problems[1]


def test_sweep_refuses_the_grid_before_writing(tmp_path, capsys, no_model_loads):
    path = grid_file(tmp_path, models=f"[{tmp_path / 'gone'}]")
    one_line_exit_2(
        ["sweep", str(path), "--out", str(tmp_path / "store"), "--no-progress"], capsys, "models[0]", "no such folder"
    )
    assert not (tmp_path / "store").exists()
    one_line_exit_2(
        ["sweep", "quick", "--model", str(tmp_path / "gone"), "--out", str(tmp_path / "store"), "--no-progress"],
        capsys,
        "no such folder",
    )
    assert not (tmp_path / "store").exists()


# -- corpus specs before the model loads ----------------------------------------------------------
def test_corpus_spec_check_matches_the_loader(tmp_path):
    from evalkit.data.corpus import load_corpus
    from evalkit.data.corpus_check import check_corpus_params, check_corpus_spec

    good = tmp_path / "ok.txt"
    good.write_text("Some prose. More prose.\n")
    for spec in ("embedded", f"file:{good}", "hf:owner/name:test", "filler", "stdlib-docs"):
        check_corpus_spec(spec)
    bad_jsonl = tmp_path / "bad.jsonl"
    bad_jsonl.write_text('{"body": "x"}\n')
    for spec in (f"file:{tmp_path / 'gone.txt'}", f"file:{bad_jsonl}", "nonsense", "hf:only-a-name"):
        with pytest.raises(EvalkitError) as early:
            check_corpus_spec(spec, "where")
        assert str(early.value).startswith("where: ")
        if not spec.startswith("hf:"):  # the same line the evaluation would give after the model load
            with pytest.raises(EvalkitError) as late:
                load_corpus(spec)
            assert str(early.value) == f"where: {late.value}"
    with pytest.raises(EvalkitError, match="^retrieval haystack: corpus file"):
        check_corpus_params({"corpus": "embedded", "haystack": f"file:{tmp_path / 'gone.txt'}"}, "retrieval")


def test_a_grids_corpus_problems_are_every_one_each_at_its_key(tmp_path):
    """What the grid path reports (:func:`~evalkit.data.corpus_check.corpus_problems`): every bad spec, keyed
    ``evals.NAME.KEY``; a file's line names the key, a description's message names the evaluation."""
    from evalkit.data.corpus_check import corpus_problems

    gone = f"file:{tmp_path / 'gone.txt'}"
    evals = {"perplexity": {"corpus": gone}, "retrieval": {"corpus": "embedded", "haystack": gone}, "decode": None}
    located = corpus_problems(evals, located=True)
    assert [key for key, _ in located] == [("evals", "perplexity", "corpus"), ("evals", "retrieval", "haystack")]
    assert all(m.startswith("corpus file") for _, m in located)
    given = corpus_problems(evals, located=False)
    assert [m.split(":")[0] for _, m in given] == ["perplexity corpus", "retrieval haystack"]
    assert corpus_problems({"perplexity": {"corpus": " "}}, located=False) == []  # a blank flag is the default


@pytest.mark.parametrize(
    "argv",
    [
        ["run", "--perplexity-corpus", "file:{gone}"],
        ["run", "--eval", "retrieval", "--retrieval-haystack", "file:{gone}"],
        ["sensitivity", "--scheme", SCHEME, "--perplexity-corpus", "file:{gone}"],
        ["calibrate", "--corpus", "file:{gone}", "--out", "{tmp}/scales.safetensors"],
        ["calibrate", "--eval-corpus", "file:{gone}", "--out", "{tmp}/scales.safetensors"],
    ],
)
def test_bad_corpus_is_refused_before_the_model_loads(argv, tmp_path, capsys, no_model_loads):
    gone = tmp_path / "gone.txt"
    argv = [a.format(gone=gone, tmp=tmp_path) for a in argv] + (
        ["--cache-dir", str(tmp_path / "c")] if argv[0] != "calibrate" else []
    )
    one_line_exit_2(argv, capsys, f"corpus file '{gone}' does not exist")


# -- Ctrl-C --------------------------------------------------------------------------------------
@pytest.mark.parametrize(
    "command, says",
    [("sweep", "run the same command again to resume"), ("report", "run the same command again to start over")],
)
def test_interrupt_says_how_to_go_on(command, says, monkeypatch, capsys):
    import importlib

    module = importlib.import_module(f"evalkit.cli.{command}")

    def interrupted(args, **kwargs):
        raise KeyboardInterrupt

    monkeypatch.setattr(module, "run", interrupted)
    argv = [command] + ([str(REPO / "published" / "default")] if command == "report" else [])
    assert main(argv) == 130
    err = capsys.readouterr().err
    assert err.startswith("evalkit: interrupted: ") and err.count("\n") == 1 and says in err


# -- lm-eval's chatter goes to the run's log ---------------------------------------------------------
def test_subprocess_output_goes_to_the_log_and_stderr_is_restored(tmp_path, capfd):
    from evalkit.runtime.runlog import to_log

    log = tmp_path / "lib.log"
    with to_log(log, ("some_library",), "call"):
        subprocess.run(["sh", "-c", "echo 'fatal: not a git repository' >&2"], check=True)
        print("from python", file=sys.stderr)
    print("after", file=sys.stderr)
    subprocess.run(["sh", "-c", "echo after-subprocess >&2"], check=True)
    err = capfd.readouterr().err
    text = log.read_text()
    assert "fatal: not a git repository" in text and "from python" in text
    assert "fatal" not in err and "from python" not in err
    assert "after" in err and "after-subprocess" in err  # the terminal is back


def test_hflm_warnings_go_to_the_run_log(tiny_llama_dir, tmp_path, capfd):
    pytest.importorskip("lm_eval")
    from evalkit.evals.lmeval.adapter import LOG_NAME, make_hflm
    from evalkit.models.loading import load_model
    from evalkit.runtime.runlog import run_folder

    lm = load_model(str(tiny_llama_dir))
    capfd.readouterr()
    with run_folder(tmp_path):
        make_hflm(lm.model, lm.tokenizer, batch_size=1)
    err = capfd.readouterr().err
    assert "pretrained" not in err and "already-initialized" not in err, err
    log = (tmp_path / LOG_NAME).read_text()
    assert "`pretrained` model kwarg is not of type `str`" in log and "already-initialized" in log


def test_logs_written_names_only_the_logs_that_grew(tmp_path):
    from evalkit.runtime.runlog import log_sizes, logs_written

    (tmp_path / "old.log").write_text("before\n")
    before = log_sizes(tmp_path)
    (tmp_path / "new.log").write_text("x\n")
    assert logs_written(tmp_path, before) == [tmp_path / "new.log"]
    assert logs_written(tmp_path / "none", {}) == []
