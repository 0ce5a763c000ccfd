"""The module that environments installed before the ``serving`` evaluation moved to its engine's folder
name in their ``evalkit.evals`` entry point; importing it registers the evaluation, which is
:mod:`evalkit.engines.vllm.serving_eval`. pyproject.toml names that module itself, so an environment
installed again (``pip install -e .``) no longer reads this one, and it can go once none is left."""

from evalkit.engines.vllm import serving_eval

__all__ = ["serving_eval"]
