"""Perplexity with KL divergence and top-1 agreement against the unquantized model."""
