"""The model under evaluation: loading (local folders, the hub, GGUF, the embedded model), its
architecture facts (layers, KV heads, head sizes, dtypes), named presets and the hub look-ups."""
