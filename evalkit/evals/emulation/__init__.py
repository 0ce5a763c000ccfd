"""The emulation backend: the transformers model with K/V through evalkit's storage cache, and its cached baselines."""
