"""A tiny random-weight Llama and its tokenizer, made and saved locally with no download (the GPU machine may have
no network): what the smoke test serves when the user names no model (``MODEL=``). Needs ``transformers`` (and
``torch``, ``tokenizers``, which it depends on); :func:`make_tiny_model` raises :class:`ModelUnavailable` saying
what is missing.

The sizes are the smallest vLLM serves on its default attention backends: head size 64 (FlashAttention's
supported sizes start at 32, the common kernels' at 64), two layers, a vocabulary of a few hundred words built
from a fixed text; the weights are bfloat16, drawn from a fixed seed.
"""

from __future__ import annotations

import importlib
from pathlib import Path
from typing import Any

CHAT_TEMPLATE = (
    "{% for message in messages %}{{ message['role'] }}: {{ message['content'] }}\n{% endfor %}"
    "{% if add_generation_prompt %}assistant: {% endif %}"
)
"""A plain chat template: ``/v1/chat/completions`` needs one."""
_TEXT = (
    "the quick brown fox jumps over the lazy dog while rain snow and wind come and go one two three four five "
    "six seven eight nine ten write a sentence about the weather count slowly from one to one hundred user "
    "assistant system hello world data designer smoke test"
)


class ModelUnavailable(RuntimeError):
    """No model can be made here (``transformers`` or what it needs is missing)."""


def _module(name: str) -> Any:
    try:
        return importlib.import_module(name)
    except ImportError as exc:
        raise ModelUnavailable(f"{name} is not importable ({exc})") from exc


def make_tiny_model(directory: Path) -> Path:
    """Save the model and its tokenizer in ``directory`` (a path ``vllm serve`` takes as MODEL); returns it."""
    transformers = _module("transformers")
    tokenizers = _module("tokenizers")
    torch = _module("torch")
    words = sorted(set(_TEXT.split()))
    specials = ["<unk>", "<s>", "</s>", "<pad>"]
    vocab = {token: i for i, token in enumerate([*specials, *words, ":", "\n"])}
    model = tokenizers.models.WordLevel(vocab=vocab, unk_token="<unk>")
    tokenizer = tokenizers.Tokenizer(model)
    tokenizer.pre_tokenizer = tokenizers.pre_tokenizers.Whitespace()
    tokenizer.decoder = tokenizers.decoders.WordPiece(prefix="##")
    fast = transformers.PreTrainedTokenizerFast(
        tokenizer_object=tokenizer, unk_token="<unk>", bos_token="<s>", eos_token="</s>", pad_token="<pad>"
    )
    fast.chat_template = CHAT_TEMPLATE
    fast.model_max_length = 1024
    config = transformers.LlamaConfig(
        vocab_size=len(vocab),
        hidden_size=256,
        intermediate_size=512,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=4,
        max_position_embeddings=1024,
        bos_token_id=vocab["<s>"],
        eos_token_id=vocab["</s>"],
        pad_token_id=vocab["<pad>"],
        torch_dtype="bfloat16",
    )
    torch.manual_seed(0)
    llama = transformers.LlamaForCausalLM(config).to(torch.bfloat16)
    directory.mkdir(parents=True, exist_ok=True)
    llama.save_pretrained(directory, safe_serialization=True)
    fast.save_pretrained(directory)
    return directory
