"""SGLang's own KV cache types as a codec family (``sglang:<kv_cache_dtype>``): today ``sglang:mxfp8``, the FA4
backend's MXFP8 cache with Q quantized alike (:mod:`.mxfp8` the arithmetic, :mod:`.family` the family)."""
