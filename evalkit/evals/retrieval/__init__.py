"""Long-context retrieval (passkey, RULER needle-in-a-haystack): task definitions, exact-length
prompts, generation through the FP8 cache, scoring and heatmaps. The evaluation itself is
:class:`evalkit.evals.retrieval.evaluation.RetrievalEval`."""
