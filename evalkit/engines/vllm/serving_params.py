"""The ``serving`` evaluation's parameters (:class:`ServingParams`: its ``--serving-<field>`` flags, grid keys
and checks), declared apart from the evaluation (:mod:`evalkit.engines.vllm.serving_eval`) so that the
``evalkit.eval_params`` entry point gives ``run --help`` its flags without importing torch or vLLM."""

from __future__ import annotations

from dataclasses import dataclass

from evalkit.evals.params import Params, param


def _budget(value, flag: str) -> float:
    from evalkit.engines.vllm.serving import check_budget
    from evalkit.errors import EvalkitError

    try:
        check_budget(value)
    except EvalkitError as exc:
        raise EvalkitError(str(exc).replace("--budget-gib", flag)) from None
    return float(value)


@dataclass(frozen=True)
class ServingParams(Params):
    budget_gib: float = param(2.0, "KV cache budget of each engine in GiB", parse=_budget)
    context: int = param(2048, "max_model_len and the tokens of one request", low=2)
    load: bool = param(False, "also measure admission under load and prefill/decode tokens/s")
    decode_tokens: int = param(16, "tokens generated per request under load", low=1)
