"""lm-eval tasks through the quantized KV cache: the evaluation, lm-eval's model adapter, request
batching and the per-item records flip rates are computed from."""
