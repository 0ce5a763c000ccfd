"""The ``longcontext`` evaluation: lm-eval's RULER and LongBench v2 per context length, paired item by item
with the baseline (:mod:`evalkit.evals.longcontext.evaluation`)."""
