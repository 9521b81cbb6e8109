"""A fixed vocabulary and seeded word/sentence helpers shared by text and schema-instance generation."""

from __future__ import annotations

import random

VOCABULARY: tuple[str, ...] = (
    "able", "accurate", "active", "answer", "apply", "balance", "basic", "benefit", "brief", "build",
    "careful", "case", "change", "check", "clear", "common", "complete", "concept", "consider", "context",
    "create", "current", "data", "deliver", "design", "detail", "direct", "effect", "example", "explain",
    "factor", "feature", "field", "final", "focus", "follow", "general", "goal", "good", "group",
    "helpful", "idea", "important", "include", "issue", "key", "known", "large", "level", "likely",
    "local", "main", "method", "model", "measure", "natural", "need", "note", "number", "offer",
    "option", "order", "part", "plan", "point", "practical", "precise", "process", "provide", "quality",
    "question", "range", "reason", "record", "relevant", "result", "review", "sample", "second", "simple",
    "small", "source", "specific", "step", "strong", "structure", "support", "system", "task", "term",
    "test", "topic", "typical", "useful", "value", "view", "whole", "work", "world", "write",
)  # fmt: skip


def words(rng: random.Random, count: int) -> list[str]:
    """``count`` words drawn from the vocabulary."""
    return [rng.choice(VOCABULARY) for _ in range(count)]


def sentence(rng: random.Random, count: int) -> str:
    """A capitalised sentence of ``count`` (at least one) words ending in a full stop."""
    text = " ".join(words(rng, max(1, count)))
    return text[0].upper() + text[1:] + "."


def paragraph(rng: random.Random, min_words: int, max_words: int) -> str:
    """Sentences of 5 to 14 words adding up to between ``min_words`` and ``max_words`` words."""
    total = rng.randint(min_words, max_words)
    parts: list[str] = []
    while total > 0:
        n = min(total, rng.randint(5, 14))
        parts.append(sentence(rng, n))
        total -= n
    return " ".join(parts)
