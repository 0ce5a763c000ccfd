"""evalkit: what does an FP8 (or INT8/INT4) KV cache cost a model in quality, and what does it save?

Public entry points::

    from evalkit import quantized_kv, parse_scheme, load_model
    with quantized_kv(model, "fp8_e4m3/head/dynamic"):
        logits = model(ids).logits
"""

from evalkit.errors import EvalkitError
from evalkit.integration.install import quantized_kv
from evalkit.kv.scheme import Scheme, parse_scheme, parse_schemes

__version__ = "0.1.0"

__all__ = ["EvalkitError", "Scheme", "parse_scheme", "parse_schemes", "quantized_kv", "__version__"]
