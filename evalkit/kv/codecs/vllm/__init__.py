"""vLLM's own KV cache dtypes: the table of every ``kv_cache_dtype`` (:mod:`.dtypes`), the family that
parses and checks them (:mod:`.family`) and one module per store kernel it models."""
