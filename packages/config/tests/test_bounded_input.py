"""Input that cannot exhaust the machine: YAML aliases refused in run files and profiles (capped elsewhere), input
size and nesting depth capped, and ranges of numbers checked against their bound before they are expanded."""

from __future__ import annotations

import subprocess
import sys
import textwrap
import tracemalloc
from pathlib import Path

import pytest

from ddslurm.config import ConfigFileError, expand_ranges, load_profile, load_run_file, read_yaml, to_builtins

RUN = "name: demo\nrecipe: recipe.yaml\nnum_records: 10\n"
PROFILE = "workspace: work\npython_env: venv\npartition: gpu\n"

# Nine levels of ten aliases each: 10**9 strings once expanded ("billion laughs").
BOMB = 'lol0: &a0 "lol"\n' + "".join(f"lol{i}: &a{i} [{', '.join([f'*a{i - 1}'] * 10)}]\n" for i in range(1, 10))


def _write(tmp_path: Path, text: str, name: str = "run.yaml") -> Path:
    path = tmp_path / name
    path.write_text(text)
    return path


def _error(load: object, path: Path) -> ConfigFileError:
    with pytest.raises(ConfigFileError) as info:
        load(path)  # type: ignore[operator]
    return info.value


# --- aliases ---


def test_an_alias_bomb_in_a_run_file_is_refused_at_once_without_expanding_it(tmp_path: Path) -> None:
    # In a child with 1 GiB of address space and 30 s: before the fix this hung at gigabytes.
    path = _write(tmp_path, RUN + BOMB)
    code = textwrap.dedent(
        f"""
        import resource, sys
        resource.setrlimit(resource.RLIMIT_AS, (1 << 30, 1 << 30))
        from ddslurm.config import ConfigFileError, load_run_file
        try:
            load_run_file(__import__("pathlib").Path({str(path)!r}))
        except ConfigFileError as exc:
            print(exc)
            sys.exit(3)
        """
    )
    # The subprocess's timeout is the bound: an expanded bomb would take minutes and gigabytes.
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=30, check=False)
    assert done.returncode == 3, done.stderr[-2000:]
    assert done.stdout.startswith(f"{path}:4:7: ")  # lol0: &a0 ... (line 4, the anchor's column)
    assert "anchors and aliases" in done.stdout


@pytest.mark.parametrize(
    ("text", "line", "col", "word"),
    [
        ("name: &n demo\nrecipe: recipe.yaml\nnum_records: 10\n", 1, 7, "&n"),
        ("name: demo\nrecipe: recipe.yaml\nnum_records: 10\nsubmission: &s {partition: gpu}\n", 4, 13, "&s"),
        ("name: demo\nrecipe: recipe.yaml\nnum_records: 10\nx: &s {}\nsubmission:\n  <<: *s\n", 4, 4, "&s"),
    ],
)
def test_any_anchor_in_a_run_file_is_refused_at_its_line_and_column(
    tmp_path: Path, text: str, line: int, col: int, word: str
) -> None:
    path = _write(tmp_path, text)
    err = _error(load_run_file, path)
    assert (err.line, err.col) == (line, col)
    assert str(err).startswith(f"{path}:{line}:{col}: ")
    assert word in err.message and "anchors and aliases" in err.message


def test_an_alias_in_a_profile_is_refused_too(tmp_path: Path) -> None:
    path = _write(tmp_path, PROFILE + "cpu_partition: &p cpu\nextra_sbatch: [*p]\n", "profile.yaml")
    err = _error(load_profile, path)
    assert (err.line, err.col) == (4, 16)
    assert "anchors and aliases" in err.message


def test_other_yaml_may_use_aliases_within_a_cap(tmp_path: Path) -> None:
    # A recipe (or Data Designer's settings) may repeat a mapping by alias, as YAML writers do...
    path = _write(tmp_path, "params: &p {temperature: 0.3}\ncolumns:\n- {name: a, params: *p}\n", "recipe.yaml")
    assert to_builtins(read_yaml(path)) == {
        "params": {"temperature": 0.3},
        "columns": [{"name": "a", "params": {"temperature": 0.3}}],
    }
    # ... but an alias bomb is refused where the repetition passes the cap, at the alias that passes it.
    bomb = _write(tmp_path, BOMB, "bomb.yaml")
    tracemalloc.start()
    try:
        err = _error(read_yaml, bomb)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < 64 * 2**20, peak  # refused before it was expanded: memory, not a clock, says so
    assert err.line is not None and 5 <= err.line <= 9 and err.col is not None
    assert "aliases repeat more than 100000 nodes" in err.message


def test_text_given_in_memory_has_the_same_limits_and_names_its_origin(tmp_path: Path) -> None:
    # A builder script's config arrives as text: read_yaml(origin, text=...) parses it under the same caps.
    origin = Path("build.py:load_config()")
    err = _error(lambda p: read_yaml(p, text=BOMB), origin)
    assert str(err).startswith("build.py:load_config():6:") and "aliases repeat more than 100000 nodes" in err.message
    err = _error(lambda p: read_yaml(p, text="#" * (16 << 20) + "\n"), origin)
    assert "larger than 16 MiB" in err.message
    assert to_builtins(read_yaml(origin, text="a: [1, 2]\n")) == {"a": [1, 2]}


def test_a_recursive_alias_is_refused(tmp_path: Path) -> None:
    path = _write(tmp_path, "a: &x\n  b: *x\n", "recipe.yaml")
    err = _error(read_yaml, path)
    assert (err.line, err.col) == (2, 6)
    assert "refers to the node that contains it" in err.message


# --- size and depth ---


def test_a_run_file_over_one_mib_is_refused_where_it_passes_the_limit(tmp_path: Path) -> None:
    comment = "# " + "x" * 1000 + "\n"  # 1003 bytes a line
    path = _write(tmp_path, RUN + comment * 1100)
    err = _error(load_run_file, path)
    over = (1 << 20) - len(RUN)
    assert (err.line, err.col) == (4 + over // 1003, over % 1003 + 1)
    assert "larger than 1 MiB" in err.message


def test_a_profile_over_one_mib_is_refused_too(tmp_path: Path) -> None:
    path = _write(tmp_path, PROFILE + "#" * (1 << 20) + "\n", "profile.yaml")
    err = _error(load_profile, path)
    assert err.line == 4 and "larger than 1 MiB" in err.message


def test_a_device_that_never_ends_is_read_only_up_to_the_limit(tmp_path: Path) -> None:
    err = _error(load_run_file, Path("/dev/zero"))
    assert "larger than 1 MiB" in err.message


@pytest.mark.parametrize(("open_", "close"), [("[", "]"), ("{a: ", "}")])
def test_nesting_deeper_than_the_limit_is_refused_at_the_node_that_passes_it(
    tmp_path: Path, open_: str, close: str
) -> None:
    depth = 5000  # before the fix: a RecursionError without a position (or a crash)
    path = _write(tmp_path, RUN + "tags: " + open_ * depth + close * depth + "\n")
    err = _error(load_run_file, path)
    assert err.line == 4 and err.col == 7 + 99 * len(open_)  # the 100th bracket: the 101st level
    assert "nested deeper than 100 levels" in err.message


def test_text_that_is_not_utf8_is_a_config_error_with_its_position(tmp_path: Path) -> None:
    path = tmp_path / "run.yaml"
    path.write_bytes(RUN.encode() + b"note: caf\xe9\n")
    err = _error(load_run_file, path)
    assert (err.line, err.col) == (4, 10)
    assert "not UTF-8" in err.message


# --- ranges ---


def test_a_range_past_the_bound_is_refused_before_it_is_expanded() -> None:
    tracemalloc.start()
    try:
        with pytest.raises(ValueError, match=r"^no shard 999999999: the run has shards 0-3$"):
            expand_ranges("0-999999999", below=4, what="shard", have="the run has shards 0-3")
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < 2**20, peak  # a billion numbers were never made (memory, not a clock, says so)
    with pytest.raises(ValueError, match=r"^no number 7: the numbers go from 0 to 4$"):
        expand_ranges("1,7", below=5)
    assert expand_ranges("0-2,1", below=4) == [0, 1, 2, 1]


def test_without_a_bound_a_range_is_capped_at_slurms_largest_array() -> None:
    with pytest.raises(ValueError, match=r"^no number 999999999: the numbers go from 0 to 4000000$"):
        expand_ranges("0-999999999")


def test_ranges_that_repeat_more_numbers_than_the_bound_holds_are_refused() -> None:
    # Each part within the bound, but together more numbers than there are: only repeats could make that many.
    with pytest.raises(ValueError, match="more numbers than the 4 there are"):
        expand_ranges(",".join(["0-3"] * 100_000), below=4)
