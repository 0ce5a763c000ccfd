"""Options shared by commands that load a model, and a check of ``--model`` before anything heavy.

Commands that load a model import torch and their evaluations while their options are parsed
(seconds). :func:`check_model_first` looks at ``--model`` before that, so a missing folder or a
hub id that is neither cached nor reachable fails at once with ``load_model``'s own one line.
"""

from __future__ import annotations

import argparse

from evalkit.models.loading import DEFAULT_MODEL, embedded_name, model_source


def add_model_arguments(p) -> None:
    g = p.add_argument_group("model")
    g.add_argument("--model", default=DEFAULT_MODEL, help="Hugging Face id, local folder, or 'embedded' (default)")
    g.add_argument(
        "--dtype", default="auto", help="float32 | bfloat16 | float16 (default: float32 on CPU, bfloat16 on CUDA)"
    )
    g.add_argument("--device", default="cpu", help="cpu, cuda, cuda:1 ... (default cpu)")
    g.add_argument("--device-map", default=None, help="e.g. 'auto' to spread a large model over several GPUs")
    g.add_argument("--attn-implementation", default="sdpa", help="the model's own attention: sdpa (default) or eager")
    g.add_argument(
        "--trust-remote-code", action="store_true", help="allow model code from the hub to run (off by default)"
    )
    g.add_argument(
        "--decode-path",
        default="auto",
        choices=("auto", "eager", "static", "compiled"),
        help="how decode steps run (decode, retrieval and lm-eval generation): compiled (a static cache under "
        "torch.compile, CUDA graphs on CUDA), static (the same cache, eager) or eager (the dynamic cache); "
        "auto (default): compiled on CUDA, eager on CPU",
    )
    g.add_argument(
        "--no-compile", dest="decode_path", action="store_const", const="eager", help="the same as --decode-path eager"
    )


def model_spec(args):
    """The model flags (:func:`add_model_arguments`) as the :class:`~evalkit.sweep.spec.ModelSpec` a run carries:
    the one place a command turns them into a spec (``run``'s grid, its pre-flight, its size estimate and the
    engine's plan read the same model)."""
    from evalkit.sweep.spec import ModelSpec

    return ModelSpec(
        name=args.model,
        dtype=str(args.dtype),
        device=str(args.device),
        device_map=getattr(args, "device_map", None),
        attn_implementation=getattr(args, "attn_implementation", "sdpa"),
        trust_remote_code=getattr(args, "trust_remote_code", False),
        decode_path=getattr(args, "decode_path", None) or "auto",
    )


def load_from_args(args):
    from evalkit.models.loading import load_model_with

    return load_model_with(args.model, args)


def check_model_first(argv: list[str]) -> None:
    """Raise EvalkitError for a ``--model`` in ``argv`` that cannot load (see :func:`evalkit.models.loading.model_source`);
    the embedded model is left to the command (its first load converts it)."""
    pre = argparse.ArgumentParser(add_help=False, allow_abbrev=False)
    pre.add_argument("--model", default=DEFAULT_MODEL)
    known, _ = pre.parse_known_args(argv)
    if not embedded_name(known.model):
        model_source(known.model)
