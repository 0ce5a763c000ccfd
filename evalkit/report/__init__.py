"""Turn a results store into what a person publishes: tables, plots, a recommendation.

Everything here reads the store (``results.jsonl`` written by ``evalkit sweep``) and never
re-runs an evaluation: :mod:`.results` loads the counted rows (runs with a completion record),
:mod:`.tables` builds the one-row-per-model-and-scheme table (Markdown, LaTeX booktabs, CSV),
:mod:`.plots` draws the Pareto frontier (:mod:`.pareto`), per-position degradation, retrieval heatmaps and per-layer
sensitivity, and :mod:`.recommend` picks the cheapest scheme inside a stated quality budget (:mod:`.budget`).
"""

from evalkit.report.budget import Budget
from evalkit.report.recommend import recommend
from evalkit.report.results import Results, load_store
from evalkit.report.tables import format_table, summary_frame

__all__ = ["Budget", "Results", "format_table", "load_store", "recommend", "summary_frame"]
