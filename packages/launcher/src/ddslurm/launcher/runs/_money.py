"""Money as every command and page shows it: thousands separated, then the price file's currency."""

from __future__ import annotations


def money(value: float, currency: str, places: int | None = None) -> str:
    """``1,234.50 USD``, ``0.1920 USD``: ``places`` decimals; by default four below one and two above."""
    shown = (4 if value < 1 else 2) if places is None else places
    return f"{value:,.{shown}f} {currency}"
