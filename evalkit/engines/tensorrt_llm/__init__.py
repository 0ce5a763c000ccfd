"""TensorRT-LLM, as evalkit models it: its KV cache quantization and its engine profile (no backend)."""
