"""llama.cpp's KV cache types: ggml's blocks as its CPU cache write stores them (:mod:`.ggml_blocks`), the
family of ``llamacpp:<k>[/<v>]`` pairs (:mod:`.family`) and what its attention does to Q (:mod:`.attention`)."""
