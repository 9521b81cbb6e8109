from __future__ import annotations

import msgspec


class Frozen(msgspec.Struct, frozen=True, forbid_unknown_fields=True, kw_only=True):
    """Base of every contract struct: immutable, strict about unknown keys, keyword-only."""
