"""The decode evaluation's size for ``sweep --dry-run``: 2 x sequences rows (teacher-forced and
free-running) of prefill + decode tokens; the baseline stores
:data:`~evalkit.evals.kl_topk.BYTES_PER_POSITION` (2008) bytes per decoded position."""

from __future__ import annotations

from evalkit.evals.decode.params import DecodeParams, step_bucket_edges
from evalkit.evals.kl_topk import BYTES_PER_POSITION
from evalkit.evals.sizing import ROW_BYTES, Forwards, Work, batches


def decode_work(params: dict, facts) -> Work:
    p = DecodeParams(**params)
    rows = 2 * p.sequences
    fw: list[Forwards] = []
    for calls, r in batches(rows, p.batch_size):
        fw.append(Forwards(calls, r, p.prefill))
        if p.decode > 1:
            fw.append(Forwards(calls * (p.decode - 1), r, 1, p.prefill + p.decode / 2, p.length))
    n_rows = 5 * len(step_bucket_edges(p.decode, p.buckets)) + 2
    fw_t = tuple(fw)
    return Work(
        "decode",
        rows * p.length,
        fw_t,
        baseline=fw_t,
        baseline_bytes=rows * p.decode * BYTES_PER_POSITION + 8 * rows * p.length,
        store_bytes=n_rows * ROW_BYTES + 84 * rows * p.decode,
    )
