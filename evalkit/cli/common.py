"""Options shared by commands that load a model."""

from __future__ import annotations

from evalkit.models import DEFAULT_MODEL


def add_model_arguments(p) -> None:
    g = p.add_argument_group("model")
    g.add_argument("--model", default=DEFAULT_MODEL, help="Hugging Face id, local folder, or 'embedded' (default)")
    g.add_argument("--dtype", default="auto", help="float32 | bfloat16 | float16 (default: float32 on CPU, bfloat16 on CUDA)")
    g.add_argument("--device", default="cpu", help="cpu, cuda, cuda:1 ... (default cpu)")
    g.add_argument("--device-map", default=None, help="e.g. 'auto' to spread a large model over several GPUs")
    g.add_argument("--attn-implementation", default="sdpa", help="the model's own attention: sdpa (default) or eager")
    g.add_argument("--trust-remote-code", action="store_true", help="allow model code from the hub to run (off by default)")


def load_from_args(args):
    from evalkit.models import load_model

    return load_model(args.model, dtype=args.dtype, device=args.device, device_map=args.device_map,
                      trust_remote_code=args.trust_remote_code, attn_implementation=args.attn_implementation)
