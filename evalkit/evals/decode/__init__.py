"""Decode-time fidelity: how a scheme's error grows while the model generates, step by step."""
