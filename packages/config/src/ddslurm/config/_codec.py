"""JSON encoding of contract structs: canonical (fields and keys sorted by name) so that hashes are stable."""

from __future__ import annotations

from pathlib import Path
from typing import Any, TypeVar

import msgspec

from ddslurm.config._files import read_regular, sha256_bytes
from ddslurm.config._layout import LAYOUT_VERSION
from ddslurm.config._plan import PLAN_VERSION, Plan
from ddslurm.config._profile import ClusterProfile
from ddslurm.config._runfile import RunFile
from ddslurm.config._yaml import MAX_INPUT_BYTES, error_at, load_struct, read_yaml
from ddslurm.config.errors import ConfigFileError

T = TypeVar("T")

_ENCODER = msgspec.json.Encoder(order="sorted")


def encode(obj: Any) -> bytes:
    """Canonical JSON: struct fields and dict keys sorted by name, no insignificant whitespace, trailing newline."""
    return _ENCODER.encode(obj) + b"\n"


def encode_pretty(obj: Any) -> bytes:
    return msgspec.json.format(_ENCODER.encode(obj), indent=2) + b"\n"


def digest(obj: Any) -> str:
    """sha256 of the canonical encoding."""
    return sha256_bytes(_ENCODER.encode(obj))


def read_json(path: Path, kind: type[T], *, own: bool = False) -> T:
    """Read a record written by ddslurm; never follows a symbolic link, never blocks on a FIFO (anything but a
    regular file is an :class:`~ddslurm.config.UnsafePathError`). ``own``: only a file of this user's that no
    other user can write (:func:`~ddslurm.config.read_regular`)."""
    try:
        data = read_regular(path, own=own)
    except FileNotFoundError:
        raise
    except OSError as exc:
        raise ConfigFileError(path, f"cannot read: {exc.strerror or exc}") from exc
    try:
        return msgspec.json.decode(data, type=kind)
    except msgspec.DecodeError as exc:
        raise ConfigFileError(path, str(exc)) from exc


def read_plan(path: Path) -> Plan:
    """A run's plan, refused with a clear message when this version of ddslurm cannot read its layout."""
    plan = read_json(path, Plan)
    if plan.version != PLAN_VERSION or plan.layout_version != LAYOUT_VERSION:
        raise ConfigFileError(
            path,
            f"written by another ddslurm version (plan {plan.version}, layout {plan.layout_version}); this one reads "
            f"plan {PLAN_VERSION}, layout {LAYOUT_VERSION}",
        )
    return plan


def load_run_file(path: Path, *, text: str | None = None) -> RunFile:
    """Load a run file strictly (unknown keys, wrong types and bad values name file:line:col and field; every
    problem of the file at once). ``text``: the file's text, already read (:func:`read_text_file`)."""
    return load_struct(path, RunFile, max_bytes=MAX_INPUT_BYTES, aliases=False, text=text)


def load_profile(path: Path, *, text: str | None = None) -> ClusterProfile:
    """Load a cluster profile; relative paths in it are made absolute against the profile's directory. ``text``:
    the file's text, already read."""
    profile = load_struct(path, ClusterProfile, max_bytes=MAX_INPUT_BYTES, aliases=False, text=text)
    base = path.resolve().parent

    def absolute(value: str) -> str:
        return str((base / value).resolve()) if not Path(value).is_absolute() else value

    executable = profile.vllm_executable
    if "/" in executable:
        executable = absolute(executable)
    try:  # validated again: a relative path made absolute takes in the profile's own folder (a space, a '%')
        return msgspec.structs.replace(
            profile,
            workspace=absolute(profile.workspace),
            python_env=absolute(profile.python_env),
            vllm_executable=executable,
        )
    except msgspec.ValidationError as exc:
        raise error_at(path, read_yaml(path, max_bytes=MAX_INPUT_BYTES, aliases=False), exc) from None
