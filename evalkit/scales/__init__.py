"""Scales: calibrating static K/V scales, and reading and writing them in engines' checkpoint formats."""
