"""Planning a deployment: serving capacity from bytes per token, and per-layer sensitivity (which
layers to keep in BF16)."""
