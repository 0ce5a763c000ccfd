"""Where evalkit meets transformers: the storage cache, the pre-hook that installs it, MLA, FA3 attention precision, the K/V observer."""
