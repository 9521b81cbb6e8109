"""A "did you mean" for a name that is not one of those accepted (a field, a model alias)."""

from __future__ import annotations

import difflib
from collections.abc import Iterable


def closest(name: str, candidates: Iterable[str]) -> str | None:
    """The candidate closest to ``name`` when one is close enough to be a misspelling of it (difflib's ratio of at
    least 0.6), else None."""
    found = difflib.get_close_matches(name, sorted(set(candidates)), n=1)
    return found[0] if found else None


def did_you_mean(name: str, candidates: Iterable[str]) -> str:
    """``"; did you mean 'NAME'?"`` with the :func:`closest` candidate, or ``""`` when none is close."""
    found = closest(name, candidates)
    return f"; did you mean {found!r}?" if found is not None else ""
