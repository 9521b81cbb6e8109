"""The first stage of a submission: the run file and the cluster profile, each read from disk once into one record
that every later stage (the profile's checks, the recipe's loading, the plan, the run's copy of the run file)
takes, so that all of them see the same bytes even when a file changes meanwhile."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from ddslurm.config import ClusterProfile, ConfigError, RunFile, load_profile, load_run_file, read_text_file
from ddslurm.launcher.errors import SubmitError


@dataclass(frozen=True, slots=True)
class SubmitInputs:
    """The run file and the profile as read once: their paths (where errors point), texts and loaded records."""

    run_path: Path
    run_text: str
    run: RunFile
    profile_path: Path
    profile_text: str
    profile: ClusterProfile

    @property
    def run_bytes(self) -> bytes:
        """The run file's bytes as read (UTF-8 text decodes and encodes back to the same bytes): the run's copy."""
        return self.run_text.encode("utf-8")


def read_inputs(run_path: Path, profile_path: Path) -> SubmitInputs:
    """Read and load the run file and the profile once; :class:`SubmitError` naming the file, line and column of
    what does not load."""
    try:
        run_text = read_text_file(run_path)
        run = load_run_file(run_path, text=run_text)
    except ConfigError as exc:
        raise SubmitError(str(exc)) from exc
    profile_text, profile = read_profile(profile_path)
    return SubmitInputs(run_path, run_text, run, profile_path, profile_text, profile)


def read_profile(profile_path: Path) -> tuple[str, ClusterProfile]:
    """The profile's text, read once, and the profile loaded from it; :class:`SubmitError` naming the file, line
    and column of what does not load."""
    try:
        text = read_text_file(profile_path)
        return text, load_profile(profile_path, text=text)
    except ConfigError as exc:
        raise SubmitError(str(exc)) from exc
