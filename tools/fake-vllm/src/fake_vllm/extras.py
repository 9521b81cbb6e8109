"""vLLM's routes outside ``/v1`` besides /health and /metrics: ``/tokenize``, ``/detokenize``, ``/pooling``,
``/classify``, ``/score`` and ``/rerank``. vLLM's API key guards only paths under ``/v1``, so these answer without
it (see vLLM's security guide); the app adds only the loading check and the model-name check.

Each builder takes a decoded JSON body and the resolved model name and returns a body shaped like vLLM's, or
raises ``BadRequest``. Everything is deterministic: token ids, vectors, probabilities and scores come from the
sha256 of the text, so the same request gets the same answer in every process.
"""

from __future__ import annotations

import hashlib
import math
import random
import time
import uuid
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from fake_vllm.content import estimate_tokens, message_text
from fake_vllm.words import VOCABULARY

MAX_MODEL_LEN = 4096
VOCAB_SIZE = 32000
POOLING_DIMENSIONS = 16
CLASS_LABELS = ("LABEL_0", "LABEL_1")
# Pieces of the stand-in's "chat template": four tokens per message, as in content.prompt_tokens.
_TEMPLATE_PIECES = ("<|start|>", "<|sep|>", "<|end|>")
_SCORE_PAIRS = (("queries", "documents"), ("queries", "items"), ("data_1", "data_2"), ("text_1", "text_2"))

Builder = Callable[[Mapping[str, Any], str], dict[str, Any]]


class BadRequest(Exception):
    """A body the route cannot accept: HTTP 400 with vLLM's ``BadRequestError`` shape."""

    def __init__(self, message: str, param: str | None = None) -> None:
        super().__init__(message)
        self.param = param


def validate_messages(messages: Any) -> list[dict[str, Any]]:
    """A chat request's ``messages``: a non-empty list of objects with a string ``role``."""
    if not isinstance(messages, list) or not messages:
        raise BadRequest("`messages` must be a non-empty list.", "messages")
    if not all(isinstance(m, dict) and isinstance(m.get("role"), str) for m in messages):
        raise BadRequest("Every message must be an object with a `role`.", "messages")
    return messages


def _rng(*parts: str) -> random.Random:
    return random.Random(hashlib.sha256("\0".join(parts).encode()).hexdigest())


def _token_id(piece: str) -> int:
    return int.from_bytes(hashlib.sha256(piece.encode()).digest()[:4], "big") % VOCAB_SIZE


def text_pieces(text: str) -> list[str]:
    """The stand-in's tokenization: four characters a token, as ``content.estimate_tokens`` counts them."""
    return [text[i : i + 4] for i in range(0, len(text), 4)]


def message_pieces(messages: Sequence[Mapping[str, Any]]) -> list[str]:
    """A chat's tokens: per message a start marker, the role, a separator, its text and an end marker, so the
    count equals ``content.prompt_tokens`` (the ``prompt_tokens`` a chat completion reports)."""
    start, sep, end = _TEMPLATE_PIECES
    pieces: list[str] = []
    for message in messages:
        pieces += [start, str(message.get("role")), sep, *text_pieces(message_text(message)), end]
    return pieces


def _usage(prompt_tokens: int) -> dict[str, Any]:
    return {
        "prompt_tokens": prompt_tokens,
        "total_tokens": prompt_tokens,
        "completion_tokens": 0,
        "prompt_tokens_details": None,
    }


def _listing(prefix: str, model: str, data: list[dict[str, Any]], prompt_tokens: int) -> dict[str, Any]:
    """vLLM's list response of the pooling family (``id``, ``object: "list"``, ``created``, ``model``...)."""
    return {
        "id": f"{prefix}-{uuid.uuid4().hex}",
        "object": "list",
        "created": int(time.time()),
        "model": model,
        "data": data,
        "usage": _usage(prompt_tokens),
    }


def _texts(body: Mapping[str, Any]) -> list[str]:
    """The inputs of a pooling or classify request: ``input`` (a string or a non-empty list of strings) or
    ``messages`` (one input: the chat's text)."""
    if "messages" in body and "input" not in body:
        return ["\n".join(message_text(m) for m in validate_messages(body["messages"]))]
    return _strings(body.get("input"), "input")


def _strings(value: Any, param: str) -> list[str]:
    if isinstance(value, str):
        return [value]
    if isinstance(value, list) and value and all(isinstance(v, str) for v in value):
        return list(value)
    raise BadRequest(f"`{param}` must be a string or a non-empty list of strings.", param)


def tokenize(body: Mapping[str, Any], model: str) -> dict[str, Any]:
    """``POST /tokenize``: ``{"prompt": str}`` or ``{"messages": [...]}`` -> ``count``, ``max_model_len``,
    ``tokens`` (and ``token_strs`` with ``return_token_strs``)."""
    if "messages" in body:
        pieces = message_pieces(validate_messages(body["messages"]))
    elif isinstance(body.get("prompt"), str):
        pieces = text_pieces(body["prompt"])
    else:
        raise BadRequest("Expected `prompt` (a string) or `messages` (a list).", "prompt")
    tokens = [_token_id(piece) for piece in pieces]
    return {
        "count": len(tokens),
        "max_model_len": MAX_MODEL_LEN,
        "tokens": tokens,
        "token_strs": pieces if body.get("return_token_strs") else None,
    }


def detokenize(body: Mapping[str, Any], model: str) -> dict[str, Any]:
    """``POST /detokenize``: ``{"tokens": [ints]}`` -> ``{"prompt": str}``, a word of the fixed vocabulary per id
    (the stand-in's ids are hashes: they do not decode back to the tokenized text)."""
    tokens = body.get("tokens")
    if not isinstance(tokens, list) or not all(
        isinstance(t, int) and not isinstance(t, bool) and 0 <= t < 2**63 for t in tokens
    ):
        raise BadRequest("`tokens` must be a list of non-negative integers.", "tokens")
    return {"prompt": " ".join(VOCABULARY[t % len(VOCABULARY)] for t in tokens)}


def pooling_vector(text: str) -> list[float]:
    """A deterministic unit vector of ``POOLING_DIMENSIONS`` floats for ``text``."""
    rng = _rng("pooling", text)
    raw = [rng.gauss(0.0, 1.0) for _ in range(POOLING_DIMENSIONS)]
    norm = math.sqrt(sum(x * x for x in raw)) or 1.0
    return [round(x / norm, 6) for x in raw]


def pooling(body: Mapping[str, Any], model: str) -> dict[str, Any]:
    """``POST /pooling``: ``input`` or ``messages`` -> one ``{"object": "pooling", "data": [floats]}`` per input."""
    texts = _texts(body)
    data = [{"index": i, "object": "pooling", "data": pooling_vector(t)} for i, t in enumerate(texts)]
    return _listing("pool", model, data, sum(estimate_tokens(t) for t in texts))


def embeddings(body: Mapping[str, Any], model: str) -> dict[str, Any]:
    """``POST /v1/embeddings`` (OpenAI's shape): ``input`` -> one ``{"object": "embedding", "embedding": [floats]}``
    per input, the same vector ``/pooling`` gives the text."""
    texts = _strings(body.get("input"), "input")
    data = [{"index": i, "object": "embedding", "embedding": pooling_vector(t)} for i, t in enumerate(texts)]
    return _listing("embd", model, data, sum(estimate_tokens(t) for t in texts))


def class_probs(text: str) -> list[float]:
    """Deterministic probabilities of the two classes for ``text`` (they sum to 1)."""
    first = round(_rng("classify", text).random(), 6)
    return [first, round(1.0 - first, 6)]


def classify(body: Mapping[str, Any], model: str) -> dict[str, Any]:
    """``POST /classify``: ``input`` or ``messages`` -> per input a ``label``, ``probs`` and ``num_classes``."""
    texts = _texts(body)
    data = []
    for index, text in enumerate(texts):
        probs = class_probs(text)
        label = CLASS_LABELS[max(range(len(probs)), key=probs.__getitem__)]
        data.append({"index": index, "label": label, "probs": probs, "num_classes": len(probs)})
    return _listing("classify", model, data, sum(estimate_tokens(t) for t in texts))


def pair_score(first: str, second: str) -> float:
    """A deterministic relevance of ``second`` to ``first``, in [0, 1): the same in /score and /rerank."""
    return round(_rng("score", first, second).random(), 6)


def _score_pairs(body: Mapping[str, Any]) -> list[tuple[str, str]]:
    for left, right in _SCORE_PAIRS:
        if left in body and right in body:
            firsts, seconds = _strings(body[left], left), _strings(body[right], right)
            if len(firsts) == 1:
                return [(firsts[0], s) for s in seconds]
            if len(firsts) != len(seconds):
                raise BadRequest(f"`{left}` must hold one item or as many as `{right}`.", left)
            return list(zip(firsts, seconds, strict=True))
    raise BadRequest("Expected `text_1` and `text_2` (or `queries` and `documents`).", "text_1")


def score(body: Mapping[str, Any], model: str) -> dict[str, Any]:
    """``POST /score``: ``text_1``/``text_2`` (one to one, one to many, or many to as many) -> one
    ``{"object": "score", "score"}`` per pair."""
    pairs = _score_pairs(body)
    data = [{"index": i, "object": "score", "score": pair_score(a, b)} for i, (a, b) in enumerate(pairs)]
    return _listing("score", model, data, sum(estimate_tokens(a) + estimate_tokens(b) for a, b in pairs))


def rerank(body: Mapping[str, Any], model: str) -> dict[str, Any]:
    """``POST /rerank`` (Jina/Cohere shape): ``query``, ``documents``, ``top_n`` (0: all) -> ``results`` by
    ``relevance_score``, highest first."""
    query = body.get("query")
    if not isinstance(query, str):
        raise BadRequest("`query` must be a string.", "query")
    documents = body.get("documents")
    if not isinstance(documents, list) or not documents or not all(isinstance(d, str) for d in documents):
        raise BadRequest("`documents` must be a non-empty list of strings.", "documents")
    top_n = body.get("top_n", 0)
    if not isinstance(top_n, int) or isinstance(top_n, bool) or top_n < 0:
        raise BadRequest("`top_n` must be a non-negative integer.", "top_n")
    ranked = sorted(((pair_score(query, doc), i, doc) for i, doc in enumerate(documents)), key=lambda r: (-r[0], r[1]))
    results = [{"index": i, "document": {"text": doc}, "relevance_score": s} for s, i, doc in ranked]
    n_tokens = sum(estimate_tokens(query) + estimate_tokens(doc) for doc in documents)
    return {
        "id": f"rerank-{uuid.uuid4().hex}",
        "model": model,
        "usage": {"prompt_tokens": n_tokens, "total_tokens": n_tokens},
        "results": results[:top_n] if top_n else results,
    }


V1_BUILDERS: dict[str, Builder] = {"/v1/embeddings": embeddings}
"""The deterministic routes under /v1 (the API key guards them, as it guards the chat route)."""
BUILDERS: dict[str, Builder] = {
    "/tokenize": tokenize,
    "/detokenize": detokenize,
    "/pooling": pooling,
    "/classify": classify,
    "/score": score,
    "/rerank": rerank,
}
