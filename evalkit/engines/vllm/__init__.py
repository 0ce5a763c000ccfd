"""vLLM as an engine: its declaration (:mod:`evalkit.engines.vllm.engine`) and what it runs on."""
