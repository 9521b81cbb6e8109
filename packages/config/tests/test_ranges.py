"""Lists of numbers as text: the batch script's --pool, --shards, Slurm's array task specs."""

from __future__ import annotations

import pytest

from ddslurm.config import compact_ranges, expand_ranges


@pytest.mark.parametrize(
    ("numbers", "text"),
    [([0, 1, 2, 5, 7, 8], "0-2,5,7-8"), ([3], "3"), ([], ""), ([4, 2, 3, 3], "2-4"), (list(range(1000)), "0-999")],
)
def test_compact_ranges_and_back(numbers: list[int], text: str) -> None:
    assert compact_ranges(numbers) == text
    if numbers:
        assert expand_ranges(text) == sorted(set(numbers))


@pytest.mark.parametrize("text", ["", "1,,3", "a", "-1", "1-b", "1-2-3", "1;2"])
def test_anything_else_is_refused(text: str) -> None:
    with pytest.raises(ValueError, match="not a list of numbers and ranges"):
        expand_ranges(text)


def test_spaces_around_numbers_are_accepted() -> None:
    assert expand_ranges(" 1, 3 - 4") == [1, 3, 4]
