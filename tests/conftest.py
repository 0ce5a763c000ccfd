"""Shared fixtures: a tiny tokenizer and a tiny random llama folder built from configs
(session-scoped), that llama loaded (``tiny``, per module), and the embedded model (loaded once
per session, converted once per machine)."""

from __future__ import annotations

import os

import pytest
import torch

from evalkit.runtime import numerics

numerics.configure()  # before any matrix product, as the command line does
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("HF_DATASETS_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
# pytest-xdist's workers share the cores: each takes its share, so N workers never run N x 2 threads on 2 cores
_WORKERS = int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1"))
torch.set_num_threads(max(1, min(2, (os.cpu_count() or 1) // _WORKERS)))


@pytest.fixture(autouse=True)
def _host_disk_decides_no_test(request, monkeypatch):
    """A sweep's disk check asks the file system for its free space (``evalkit.sweep.estimate.disk_free``).
    In a test the answer is 1 TiB, so the host's free disk decides no outcome: a CI machine with 11 GiB free
    failed the gpu preset's dry runs on its 15 GiB model download. The tests of the check pass their own
    ``free_space``; ``@pytest.mark.host_disk`` keeps the real query."""
    if request.node.get_closest_marker("host_disk") is None:
        monkeypatch.setattr("evalkit.sweep.estimate.disk_free", lambda path: 2**40)


@pytest.fixture(scope="session")
def tiny_tokenizer_dir(tmp_path_factory):
    """A byte-level BPE tokenizer trained in a second on the embedded corpus, saved as a folder."""
    from tests.tiny_models import make_tokenizer_dir

    return make_tokenizer_dir(tmp_path_factory.mktemp("tok"))


@pytest.fixture(scope="session")
def tiny_llama_dir(tmp_path_factory, tiny_tokenizer_dir):
    """A tiny random llama saved as a local model folder (config, weights, tokenizer)."""
    from tests.tiny_models import make_model_dir

    return make_model_dir(tmp_path_factory.mktemp("tiny_llama"), "llama", tiny_tokenizer_dir)


@pytest.fixture(scope="module")
def tiny(tiny_llama_dir):
    """The tiny llama loaded as evalkit loads any model folder (a LoadedModel), once per test module:
    the one tiny-model fixture (``tiny.model`` is the transformers model itself)."""
    from evalkit.models.loading import load_model

    return load_model(str(tiny_llama_dir))


@pytest.fixture(scope="session")
def embedded():
    """The embedded SmolLM2-135M-Instruct, float32 on CPU."""
    from evalkit.models.loading import load_model

    return load_model("embedded")


@pytest.fixture
def toy_eval(monkeypatch):
    """The test-only ``toy`` evaluation (tests/toy_eval.py), registered for one test."""
    from evalkit.evals import base

    from tests.toy_eval import TOY_PATH, ToyEval

    monkeypatch.setitem(base._REGISTRY, "toy", TOY_PATH)
    ToyEval.prepare_calls.clear()
    return ToyEval


@pytest.fixture
def network_lookups(monkeypatch):
    """Every host name looked up during the test, each lookup refused at once (as on a machine without
    network): a test that a failure comes "fast" counts the attempts a retry loop would make, instead of
    timing them on a shared machine."""
    import socket

    hosts: list[str] = []

    def refuse(host, *args, **kwargs):
        hosts.append(str(host))
        raise socket.gaierror(socket.EAI_NONAME, "name does not resolve (test)")

    monkeypatch.setattr(socket, "getaddrinfo", refuse)
    return hosts
