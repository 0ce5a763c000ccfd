"""The engine codec families evalkit ships, one folder each, registered as this package is imported.

:mod:`evalkit.kv.codec` imports this package the first time it is asked for a family, so a scheme
string such as ``vllm:int4_per_token_head`` or ``llamacpp:q8_0/q4_0`` parses wherever one is read.
Each family module registers itself (:func:`evalkit.kv.codec.register_family`); the slot codecs they
are made of are :mod:`evalkit.kv.codecs.slot`.

- :mod:`evalkit.kv.codecs.vllm`: vLLM's ``kv_cache_dtype`` values (``vllm:<dtype>``);
- :mod:`evalkit.kv.codecs.llamacpp`: llama.cpp's ``--cache-type-k/-v`` pairs (``llamacpp:<k>[/<v>]``);
- :mod:`evalkit.kv.codecs.dsv4`: the DeepSeek V4 / V4.1 records vLLM's ``fp8_ds_mla`` stores on a DeepSeek
  V4 model (``dsv4:<record>``);
- :mod:`evalkit.kv.codecs.sglang`: SGLang's own cache types (``sglang:mxfp8``, Q quantized alike).
"""

from evalkit.kv.codecs.dsv4 import family as dsv4_family
from evalkit.kv.codecs.llamacpp import family as llamacpp_family
from evalkit.kv.codecs.sglang import family as sglang_family
from evalkit.kv.codecs.vllm import family as vllm_family

__all__ = ["dsv4_family", "llamacpp_family", "sglang_family", "vllm_family"]
