"""llama.cpp as an engine: its declaration (:mod:`evalkit.engines.llamacpp.engine`), the runtime through
llama-cpp-python (:mod:`~evalkit.engines.llamacpp.runtime`: the library; ``cache_types``, ``llama_log``,
``model``, ``context``: a GGUF and its contexts), ggml's own quantizers through ctypes
(:mod:`~evalkit.engines.llamacpp.ggml_lib`), the backend, conformance and capacity commands."""
