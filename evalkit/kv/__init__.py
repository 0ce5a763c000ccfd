"""Core KV quantization math (no transformers import): formats, schemes, rounding, quantize/dequantize, scale tables."""
