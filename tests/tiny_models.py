"""Tiny random models of many architectures, built from configs, for offline tests.

``tiny_config(arch)`` returns a config with 2-4 layers, hidden size 64, GQA where the
architecture has it; ``tiny_model(arch)`` builds it with fixed seeds in float32.
"""

from __future__ import annotations

from pathlib import Path

import torch
import transformers as tf

VOCAB = 128

EAGER_ONLY = {"gemma2"}  # soft-capping: transformers refuses sdpa for it

ARCHS = ["llama", "mistral", "qwen2", "qwen3", "gemma", "gemma2", "gemma3", "gpt2", "gpt_neox", "opt", "phi3"]


def tiny_config(arch: str, vocab: int = VOCAB):
    common = dict(
        vocab_size=vocab,
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=512,
    )
    if arch == "llama":
        return tf.LlamaConfig(**common)
    if arch == "mistral":
        return tf.MistralConfig(**common, sliding_window=None)
    if arch == "qwen2":
        return tf.Qwen2Config(**common)
    if arch == "qwen3":
        return tf.Qwen3Config(**common, head_dim=16)
    if arch == "gemma":
        return tf.GemmaConfig(**common, head_dim=16)
    if arch == "gemma2":
        return tf.Gemma2Config(
            **common, head_dim=16, sliding_window=8, final_logit_softcapping=30.0, attn_logit_softcapping=50.0
        )
    if arch == "gemma3":
        return tf.Gemma3TextConfig(
            **{**common, "num_hidden_layers": 4},
            head_dim=16,
            sliding_window=8,
            layer_types=["sliding_attention", "sliding_attention", "sliding_attention", "full_attention"],
        )
    if arch == "phi3":
        return tf.Phi3Config(**common, pad_token_id=0)
    if arch == "gpt2":
        return tf.GPT2Config(vocab_size=vocab, n_embd=64, n_layer=2, n_head=4, n_positions=512)
    if arch == "gpt_neox":
        return tf.GPTNeoXConfig(
            vocab_size=vocab,
            hidden_size=64,
            intermediate_size=128,
            num_hidden_layers=2,
            num_attention_heads=4,
            max_position_embeddings=512,
        )
    if arch == "opt":
        return tf.OPTConfig(
            vocab_size=vocab,
            hidden_size=64,
            ffn_dim=128,
            num_hidden_layers=2,
            num_attention_heads=4,
            word_embed_proj_dim=64,
            max_position_embeddings=512,
        )
    if arch == "deepseek_v3":  # MLA; layer 0 dense, layers 1-2 MoE
        return tf.DeepseekV3Config(
            vocab_size=vocab,
            hidden_size=64,
            intermediate_size=128,
            moe_intermediate_size=32,
            num_hidden_layers=3,
            num_attention_heads=4,
            num_key_value_heads=4,
            n_routed_experts=4,
            num_experts_per_tok=2,
            n_shared_experts=1,
            first_k_dense_replace=1,
            kv_lora_rank=32,
            q_lora_rank=48,
            qk_rope_head_dim=8,
            qk_nope_head_dim=16,
            v_head_dim=16,
            n_group=1,
            topk_group=1,
            max_position_embeddings=512,
        )
    raise KeyError(arch)


def llama_head64(kv_heads: int = 2, layers: int = 4, heads: int = 2):
    """A tiny llama with head_dim 64, the engine codecs' smallest head size (MHA when ``kv_heads == heads``)."""
    torch.manual_seed(0)
    cfg = tf.LlamaConfig(
        vocab_size=VOCAB,
        hidden_size=128,
        intermediate_size=128,
        num_hidden_layers=layers,
        num_attention_heads=heads,
        num_key_value_heads=kv_heads,
        head_dim=64,
        max_position_embeddings=512,
    )
    return tf.AutoModelForCausalLM.from_config(cfg, attn_implementation="sdpa").eval()


def ds_mla_config(latent: int = 512, rope: int = 64):
    """A tiny DeepSeek-V3 config with an MLA latent of ``latent`` values and a RoPE key of ``rope``
    (V3.2's 512 + 64 by default: what vLLM's ``fp8_ds_mla`` / ``nvfp4_ds_mla`` rows store)."""
    return tf.DeepseekV3Config(
        vocab_size=VOCAB,
        hidden_size=64,
        intermediate_size=128,
        moe_intermediate_size=32,
        num_hidden_layers=2,
        num_attention_heads=2,
        num_key_value_heads=2,
        n_routed_experts=4,
        num_experts_per_tok=2,
        n_shared_experts=1,
        first_k_dense_replace=1,
        kv_lora_rank=latent,
        q_lora_rank=48,
        qk_rope_head_dim=rope,
        qk_nope_head_dim=16,
        v_head_dim=16,
        n_group=1,
        topk_group=1,
        max_position_embeddings=256,
    )


def ds_mla_512():
    """The tiny DeepSeek MLA model of :func:`ds_mla_config`, seeded."""
    torch.manual_seed(0)
    return tf.AutoModelForCausalLM.from_config(ds_mla_config()).eval()


def tiny_model(arch: str, attn_implementation: str = "sdpa", seed: int = 0, vocab: int = VOCAB):
    torch.manual_seed(seed)
    if arch in EAGER_ONLY:
        attn_implementation = "eager"
    model = tf.AutoModelForCausalLM.from_config(tiny_config(arch, vocab), attn_implementation=attn_implementation)
    return model.eval()


def make_tokenizer_dir(folder: Path) -> Path:
    """Train a byte-level BPE tokenizer (vocab 512) on documentation prose and save it."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    from evalkit.data.frozen import pydoc_topics

    topics = pydoc_topics()  # the frozen copy: the same tokenizer on every Python

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=512, special_tokens=["<|endoftext|>", "<pad>"], initial_alphabet=pre_tokenizers.ByteLevel.alphabet()
    )
    tok.train_from_iterator(list(topics.values())[:200], trainer)
    fast = tf.PreTrainedTokenizerFast(
        tokenizer_object=tok, eos_token="<|endoftext|>", bos_token="<|endoftext|>", pad_token="<pad>"
    )
    fast.save_pretrained(folder)
    return Path(folder)


def make_model_dir(folder: Path, arch: str, tokenizer_dir: Path, seed: int = 0) -> Path:
    """A tiny random model with the tiny tokenizer, saved as a local model folder."""
    tok = tf.AutoTokenizer.from_pretrained(tokenizer_dir)
    model = tiny_model(arch, seed=seed, vocab=len(tok))
    model.config.eos_token_id = tok.eos_token_id
    model.config.bos_token_id = tok.bos_token_id
    model.config.pad_token_id = tok.pad_token_id
    model.save_pretrained(folder)
    tok.save_pretrained(folder)
    return Path(folder)


def save_llama_dir(folder: Path, tokenizer_dir, **shape) -> Path:
    """A tiny random llama (seed 0) of ``shape`` (LlamaConfig fields), saved with the tiny tokenizer into
    ``folder``: its vocabulary and special tokens from that tokenizer."""
    tok = tf.AutoTokenizer.from_pretrained(tokenizer_dir)
    torch.manual_seed(0)
    cfg = tf.LlamaConfig(
        vocab_size=len(tok),
        max_position_embeddings=512,
        eos_token_id=tok.eos_token_id,
        bos_token_id=tok.bos_token_id,
        pad_token_id=tok.pad_token_id,
        **shape,
    )
    tf.AutoModelForCausalLM.from_config(cfg).save_pretrained(folder)
    tok.save_pretrained(folder)
    return folder


def turboquant_llama(folder: Path, tokenizer_dir, **overrides):
    """A tiny llama of 6 layers, head_dim 64, saved with the tiny tokenizer into ``folder`` and loaded as evalkit
    loads a folder: vLLM's TurboQuant keeps layers 0, 1, 4 and 5 unquantized, so layers 2 and 3 read its codes."""
    from evalkit.models.loading import load_model

    shape = dict(
        hidden_size=128,
        intermediate_size=128,
        num_hidden_layers=6,
        num_attention_heads=2,
        num_key_value_heads=2,
        head_dim=64,
    )
    save_llama_dir(folder, tokenizer_dir, **{**shape, **overrides})
    return load_model(str(folder))
