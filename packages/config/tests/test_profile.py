"""Cluster-profile loading: defaults, relative paths against the profile's directory, strict errors."""

from __future__ import annotations

from pathlib import Path

import msgspec
import pytest

from ddslurm.config import ClusterProfile, ConfigFileError, load_profile


def write(path: Path, text: str) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text, encoding="utf-8")
    return path


def test_minimal_profile_fills_every_default(tmp_path: Path) -> None:
    path = write(tmp_path / "profile.yaml", "workspace: /abs/ws\npython_env: /abs/venv\n")

    profile = load_profile(path)

    assert profile == ClusterProfile(
        name="default",
        workspace="/abs/ws",
        python_env="/abs/venv",
        account=None,
        partition=None,
        cpu_partition=None,
        gpus_per_node=0,
        gpu_request="gres",
        memory_per_gpu=None,
        container_runtime="none",
        container_mounts=(),
        vllm_executable="vllm",
        vllm_image=None,
        extra_sbatch=(),
    )


def test_relative_paths_resolve_against_the_profile_directory(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    elsewhere = tmp_path / "cwd"
    elsewhere.mkdir()
    monkeypatch.chdir(elsewhere)  # the working directory must not matter
    path = write(
        tmp_path / "conf" / "site" / "profile.yaml",
        "workspace: ../work\npython_env: venv\nvllm_executable: bin/vllm\n",
    )

    profile = load_profile(path)

    assert profile.workspace == str(tmp_path.resolve() / "conf" / "work")
    assert profile.python_env == str(tmp_path.resolve() / "conf" / "site" / "venv")
    assert profile.vllm_executable == str(tmp_path.resolve() / "conf" / "site" / "bin" / "vllm")


def test_relative_profile_path_is_resolved_from_the_working_directory(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    write(tmp_path / "p" / "profile.yaml", "workspace: ws\npython_env: /opt/env\n")
    monkeypatch.chdir(tmp_path)

    profile = load_profile(Path("p/profile.yaml"))

    assert profile.workspace == str(tmp_path.resolve() / "p" / "ws")


@pytest.mark.parametrize(
    ("executable", "want"),
    [
        pytest.param("vllm", "vllm", id="bare-command-stays-a-PATH-lookup"),
        pytest.param("/usr/bin/vllm", "/usr/bin/vllm", id="absolute-unchanged"),
        pytest.param(None, "vllm", id="absent"),
    ],
)
def test_vllm_executable_forms(tmp_path: Path, executable: str | None, want: str | None) -> None:
    text = "workspace: /ws\npython_env: /env\n"
    if executable is not None:
        text += f"vllm_executable: {executable}\n"
    profile = load_profile(write(tmp_path / "profile.yaml", text))
    assert profile.vllm_executable == want


def test_absolute_paths_are_unchanged(tmp_path: Path) -> None:
    profile = load_profile(write(tmp_path / "profile.yaml", "workspace: /srv/ws\npython_env: /srv/env\n"))
    assert (profile.workspace, profile.python_env) == ("/srv/ws", "/srv/env")


def test_example_profile_loads() -> None:
    example = Path(__file__).resolve().parents[3] / "examples" / "local-profile.yaml"
    profile = load_profile(example)
    root = example.resolve().parent.parent
    assert profile.name == "local"
    assert profile.workspace == str((root / ".ddslurm-work").resolve())
    assert profile.python_env == str((root / ".venv").resolve())
    assert (profile.partition, profile.cpu_partition, profile.gpus_per_node) == ("gpu", "cpu", 4)


@pytest.mark.parametrize(
    ("text", "line", "col", "field", "message"),
    [
        pytest.param("python_env: /e\n", 1, 1, "workspace", "required field is missing", id="missing-workspace"),
        pytest.param(
            "workspace: /w\npython_env: /e\ngpus_per_node: -1\n",
            3,
            1,
            "gpus_per_node",
            "expected int >= 0",
            id="negative-gpus",
        ),
        pytest.param(
            "workspace: /w\npython_env: /e\ngpu_request: both\n",
            3,
            1,
            "gpu_request",
            "invalid enum value 'both'",
            id="bad-gpu-request",
        ),
        pytest.param(
            "workspace: /w\npython_env: /e\ncontainer_runtime: docker\n",
            3,
            1,
            "container_runtime",
            "invalid enum value 'docker'",
            id="bad-container-runtime",
        ),
        pytest.param(
            "workspace: /w\npython_env: /e\ncontainer_mounts:\n  - /a\n  - 3\n",
            5,
            5,
            "container_mounts[1]",
            "expected str, got int",
            id="wrong-type-in-list",
        ),
        pytest.param(
            "workspace: /w\npython_env: /e\ncpu_partiton: cpu\n",
            3,
            1,
            "cpu_partiton",
            "unknown field; did you mean 'cpu_partition'?",
            id="unknown-key",
        ),
    ],
)
def test_profile_errors_name_line_column_and_field(
    tmp_path: Path, text: str, line: int, col: int, field: str, message: str
) -> None:
    path = write(tmp_path / "profile.yaml", text)

    with pytest.raises(ConfigFileError) as info:
        load_profile(path)

    assert str(info.value) == f"{path}:{line}:{col}: {field}: {message}"


def test_profile_is_frozen(tmp_path: Path) -> None:
    profile = load_profile(write(tmp_path / "profile.yaml", "workspace: /w\npython_env: /e\n"))
    with pytest.raises(AttributeError):
        profile.workspace = "/elsewhere"  # type: ignore[misc]
    assert msgspec.structs.replace(profile, workspace="/x").workspace == "/x"
    assert profile.workspace == "/w"
