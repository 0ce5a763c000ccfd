"""SGLang, as evalkit models it: its ``--kv-cache-dtype`` values and its engine profile (no backend)."""
