"""The recipe parts that cannot be sharded exactly are refused where they are written (``_shardable``); the
engine-level cases, through ``prepare``, are in tests/test_column_types.py."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from ddslurm.launcher.errors import SubmitError
from ddslurm.launcher.submission._shardable import refuse_unshardable

SHORTHAND = """\
columns:
- {name: topic, column_type: sampler, sampler_type: category, params: {values: [a]}}
- {name: who, column_type: sampler, sampler_type: person, params: {}}
"""
SHORTHAND_DATA = {
    "columns": [
        {"name": "topic", "column_type": "sampler", "sampler_type": "category", "params": {"values": ["a"]}},
        {"name": "who", "column_type": "sampler", "sampler_type": "person", "params": {}},
    ]
}
"""What :data:`SHORTHAND` loads as."""


def test_a_shorthand_recipe_is_refused_at_the_line_of_its_field(tmp_path: Path) -> None:
    path = tmp_path / "recipe.yaml"
    path.write_text(SHORTHAND)
    with pytest.raises(SubmitError, match=r"recipe\.yaml:3:\d+: columns\[1\]\.sampler_type \('who'\): person"):
        refuse_unshardable(SHORTHAND_DATA, path)


def test_a_json_recipe_and_a_builders_config_name_the_field(tmp_path: Path) -> None:
    recipe = {"data_designer": {"columns": [], "processors": [{"processor_type": "schema_transform", "name": "t"}]}}
    path = tmp_path / "recipe.json"
    path.write_text(json.dumps(recipe, indent=1))
    with pytest.raises(SubmitError, match=r"recipe\.json:\d+:\d+: processors\[0\]\.processor_type \('t'\)"):
        refuse_unshardable(recipe, path)
    builder = Path(f"{tmp_path}/build.py:load_config_builder()")  # a builder's config has no lines
    with pytest.raises(SubmitError, match=r"build\.py:load_config_builder\(\): processors\[0\]\.processor_type"):
        refuse_unshardable(recipe, builder)


def test_what_can_be_sharded_passes(tmp_path: Path) -> None:
    recipe = {
        "columns": [{"name": "x", "column_type": "sampler", "sampler_type": "person_from_faker"}],
        "processors": [{"processor_type": "drop_columns", "name": "d", "column_names": ["x"]}],
    }
    refuse_unshardable(recipe, tmp_path / "recipe.yaml")  # no file needed: nothing to place
