"""Text and shipped files: corpora for perplexity, decode and retrieval haystacks, and the package
data folders (tasks, sweeps, calibration) found in a checkout or an installed wheel."""
