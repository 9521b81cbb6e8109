"""Canonical encoding, digests, frozen structs, read_json and the YAML helpers."""

from __future__ import annotations

import hashlib
from pathlib import Path

import msgspec
import pytest

from ddslurm.config import (
    AttemptRecord,
    ConfigFileError,
    FileEntry,
    Plan,
    ProviderSnapshot,
    Resources,
    ShardSpec,
    SnapshotModel,
    SnapshotProvider,
    WinnerRecord,
    digest,
    encode,
    encode_pretty,
    load_struct,
    locate,
    read_json,
    read_yaml,
    to_builtins,
)


def make_plan(**overrides: object) -> Plan:
    fields: dict[str, object] = {
        "run_id": "r1",
        "run_name": "demo",
        "num_records": 10,
        "shards": (ShardSpec(index=0, first_record=0, num_records=10),),
        "resume": "if_possible",
        "buffer_size": 10,
        "recipe_file": "/w/runs/r1/inputs/recipe.yaml",
        "recipe_sha256": "a" * 64,
        "snapshot_file": "/w/runs/r1/inputs/snapshot.json",
        "snapshot_sha256": "b" * 64,
        "secret_env": ("KEY",),
        "python_env": "/venv",
        "generation": Resources(time_minutes=60),
        "collection": Resources(time_minutes=30),
    }
    fields.update(overrides)
    return Plan(**fields)  # type: ignore[arg-type]


def test_encode_is_compact_sorted_by_field_name_and_newline_terminated() -> None:
    # Sorted by name, so reordering a struct's fields in the source never changes a plan's digest.
    data = encode(ShardSpec(index=1, first_record=5, num_records=3))
    assert data == b'{"first_record":5,"index":1,"num_records":3,"seed_end":null,"seed_start":null}\n'


def test_encode_sorts_nested_dict_keys() -> None:
    a = SnapshotModel(alias="x", model="m", provider="p", inference_parameters={"b": 1, "a": {"z": 1, "y": 2}})
    b = SnapshotModel(alias="x", model="m", provider="p", inference_parameters={"a": {"y": 2, "z": 1}, "b": 1})
    assert encode(a) == encode(b)
    assert b'"inference_parameters":{"a":{"y":2,"z":1},"b":1}' in encode(a)


def test_digest_is_sha256_of_the_canonical_encoding_without_newline() -> None:
    plan = make_plan()
    assert digest(plan) == hashlib.sha256(encode(plan).rstrip(b"\n")).hexdigest()
    assert len(digest(plan)) == 64


def test_equal_structs_have_equal_digests() -> None:
    assert make_plan() == make_plan()
    assert digest(make_plan()) == digest(make_plan())
    assert encode(make_plan()) == encode(make_plan())


@pytest.mark.parametrize(
    "change",
    [
        pytest.param({"run_id": "r2"}, id="run-id"),
        pytest.param({"num_records": 11}, id="num-records"),
        pytest.param({"secret_env": ()}, id="secret-env"),
        pytest.param({"resume": "never"}, id="resume"),
        pytest.param({"generation": Resources(time_minutes=61)}, id="nested-resources"),
        pytest.param({"client_cpus": 7}, id="default-field-set"),
    ],
)
def test_different_structs_have_different_digests(change: dict[str, object]) -> None:
    assert digest(make_plan(**change)) != digest(make_plan())


def test_encode_pretty_round_trips() -> None:
    plan = make_plan()
    pretty = encode_pretty(plan)
    assert pretty.endswith(b"}\n")
    assert b'\n  "buffer_size": 10,' in pretty
    assert msgspec.json.decode(pretty, type=Plan) == plan


@pytest.mark.parametrize(
    ("obj", "field", "value"),
    [
        pytest.param(make_plan(), "num_records", 1, id="plan"),
        pytest.param(Resources(time_minutes=1), "gres", "gpu:1", id="resources"),
        pytest.param(ShardSpec(index=0, first_record=0, num_records=1), "index", 3, id="shard-spec"),
        pytest.param(SnapshotProvider(name="p", endpoint="e"), "api_key_env", "X", id="snapshot-provider"),
        pytest.param(ProviderSnapshot(), "providers", (), id="snapshot"),
        pytest.param(FileEntry(path="a", size=1, sha256="0"), "size", 2, id="file-entry"),
    ],
)
def test_contract_structs_are_frozen(obj: object, field: str, value: object) -> None:
    before = getattr(obj, field)
    with pytest.raises(AttributeError):
        setattr(obj, field, value)
    assert getattr(obj, field) == before


def test_secret_env_names_are_sorted_and_unique() -> None:
    snapshot = ProviderSnapshot(
        providers=(
            SnapshotProvider(name="b", endpoint="e", api_key_env="ZED_KEY"),
            SnapshotProvider(name="a", endpoint="e", api_key_env="ALPHA_KEY"),
            SnapshotProvider(name="c", endpoint="e", api_key_env="ZED_KEY"),
            SnapshotProvider(name="d", endpoint="e"),
            SnapshotProvider(name="ddslurm-local-x", endpoint="", local=True),
        )
    )
    assert snapshot.secret_env_names() == ("ALPHA_KEY", "ZED_KEY")


def test_read_json_round_trips_a_record(tmp_path: Path) -> None:
    record = WinnerRecord(
        shard=3,
        attempt="attempt-17",
        rows=5,
        dataset_dir="d",
        files=(FileEntry(path="p.parquet", size=10, sha256="c" * 64),),
        plan_sha256="d" * 64,
        published_at="2024-01-01T00:00:00Z",
    )
    path = tmp_path / "winner.json"
    path.write_bytes(encode(record))
    assert read_json(path, WinnerRecord) == record


ATTEMPT = b'{"shard":0,"attempt":"attempt-1","job_id":"1","node":"n1","state":"running","started_at":"t"}'


def test_attempt_fixture_is_valid(tmp_path: Path) -> None:
    path = tmp_path / "attempt.json"
    path.write_bytes(ATTEMPT)
    assert read_json(path, AttemptRecord).state == "running"


@pytest.mark.parametrize(
    ("content", "message"),
    [
        pytest.param(b"{not json", "JSON is malformed", id="malformed"),
        pytest.param(
            ATTEMPT.replace(b'"running"', b'"exploded"'),
            "Invalid enum value 'exploded' - at `$.state`",
            id="bad-enum",
        ),
        pytest.param(
            ATTEMPT.replace(b"}", b',"bogus":1}'),
            "Object contains unknown field `bogus`",
            id="unknown-field",
        ),
    ],
)
def test_read_json_rejects_bad_records(tmp_path: Path, content: bytes, message: str) -> None:
    path = tmp_path / "attempt.json"
    path.write_bytes(content)
    with pytest.raises(ConfigFileError) as info:
        read_json(path, AttemptRecord)
    assert str(info.value).startswith(f"{path}: ")
    assert message in str(info.value)


def test_read_json_missing_file_is_file_not_found(tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError):
        read_json(tmp_path / "absent.json", Plan)


def test_read_json_refuses_a_symlink(tmp_path: Path) -> None:
    real = tmp_path / "real.json"
    real.write_bytes(encode(make_plan()))
    link = tmp_path / "run.json"
    link.symlink_to(real)
    with pytest.raises(ConfigFileError, match=r"cannot read"):
        read_json(link, Plan)


def test_to_builtins_strips_ruamel_types(tmp_path: Path) -> None:
    path = tmp_path / "x.yaml"
    path.write_text("a: 0.5\nb: 0x10\nc: [1, true, null, text]\nd: {e: 1.0e3}\n7: seven\n", encoding="utf-8")
    plain = to_builtins(read_yaml(path))
    assert plain == {"a": 0.5, "b": 16, "c": [1, True, None, "text"], "d": {"e": 1000.0}, 7: "seven"}
    assert type(plain) is dict
    assert type(plain["a"]) is float
    assert type(plain["b"]) is int
    assert type(plain["c"]) is list
    assert type(plain["c"][3]) is str


@pytest.mark.parametrize(
    ("steps", "want"),
    [
        pytest.param([], (1, 1), id="root"),
        pytest.param(["top"], (1, 1), id="top-key"),
        pytest.param(["top", "inner"], (2, 3), id="nested-key"),
        pytest.param(["top", "items", 1], (5, 7), id="list-item"),
        pytest.param(["top", "items", 1, "b"], (5, 7), id="key-in-list-item"),
        pytest.param(["top", "items", 1, "c"], (6, 7), id="second-key-in-list-item"),
        pytest.param(["top", "missing", "deeper"], (1, 1), id="stops-at-deepest-existing"),
        pytest.param(["top", "items", 9], (3, 3), id="index-out-of-range"),
    ],
)
def test_locate(tmp_path: Path, steps: list[str | int], want: tuple[int, int]) -> None:
    path = tmp_path / "x.yaml"
    path.write_text("top:\n  inner: 1\n  items:\n    - a: 1\n    - b: 2\n      c: 3\n", encoding="utf-8")
    assert locate(read_yaml(path), steps) == want


class Inner(msgspec.Struct, forbid_unknown_fields=True):
    headers: dict[str, str] | None = None


class Outer(msgspec.Struct, forbid_unknown_fields=True):
    items: tuple[Inner, ...] = ()


@pytest.mark.parametrize(
    ("text", "want"),
    [
        pytest.param(
            "items:\n  - headers:\n      X-Foo: 3\n",
            "2:5: items[0].headers: expected str, got int",
            id="bad-dict-value-names-the-dict",
        ),
        pytest.param(
            "items:\n  - headers:\n      404: x\n",
            "2:5: items[0].headers: expected str, got int (in a mapping key)",
            id="bad-dict-key-names-the-dict",
        ),
    ],
)
def test_errors_inside_mappings_name_the_mapping_field(tmp_path: Path, text: str, want: str) -> None:
    path = tmp_path / "x.yaml"
    path.write_text(text, encoding="utf-8")
    with pytest.raises(ConfigFileError) as info:
        load_struct(path, Outer)
    assert str(info.value) == f"{path}:{want}"


def test_load_struct_prepare_runs_before_conversion(tmp_path: Path) -> None:
    path = tmp_path / "x.yaml"
    path.write_text("items:\n", encoding="utf-8")

    def prepare(tree: dict[str, object]) -> dict[str, object]:
        return {**tree, "items": tree["items"] or []}

    assert load_struct(path, Outer, prepare=prepare) == Outer(items=())


def test_read_yaml_unreadable_path(tmp_path: Path) -> None:
    with pytest.raises(ConfigFileError) as info:
        read_yaml(tmp_path)
    assert str(info.value).startswith(f"{tmp_path}: cannot read: ")
