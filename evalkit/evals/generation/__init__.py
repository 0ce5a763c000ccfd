"""``generation``: lm-eval generate-until tasks and an operator's own prompts, generated as the model is served
(chat template, system prompt, sampling settings, seeded samples), with per-item paired statistics."""
