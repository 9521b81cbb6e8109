"""A ``python_env`` another user can write is refused before anything in it runs: ``doctor`` reports it (and asks
it nothing), ``submit --dry-run`` and ``providers`` refuse it, naming the path and who can write it. The
environment here is a stand-in whose ``bin/ddslurm-runtime`` leaves a mark when it runs, with the layout of a
virtual environment (``bin/python`` a link to an interpreter, ``lib/python3.11/site-packages``)."""

from __future__ import annotations

import os
import shlex
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path

import pytest

from ddslurm.launcher import Slurm, SubmitError, doctor, dry_run
from ddslurm.launcher.cluster._python_env import python_env_problem
from ddslurm.launcher.cluster._slurm import Completed
from ddslurm.launcher.submission._aliases import describe_aliases
from ddslurm.launcher.testing import write_runtime_shim, write_unit_run

NOBODY = 65534
SINFO = "g1|gpu*|16|32000|gpu:4|up|infinite\nc1|cpu|8|16000|(null)|up|infinite\n"


class Cluster:
    """Answers ``sinfo`` and ``scontrol show config``; anything else fails (the checks that need it are skipped)."""

    def __call__(self, argv: Sequence[str], *, env: Mapping[str, str] | None = None) -> Completed:
        if argv[0] == "sinfo":
            return Completed(0, SINFO, "")
        if list(argv[:3]) == ["scontrol", "show", "config"]:
            return Completed(0, "ClusterName = canned\nSelectType = select/cons_tres\n", "")
        return Completed(1, "", "not answered here")


def _stand_in_env(root: Path) -> tuple[Path, Path]:
    """A python_env under ``root`` whose runtime writes ``ran`` before it runs the real one, with ``bin/python`` a
    link to an interpreter of its own (``interp/bin/python3.11``, its standard library ``interp/lib/python3.11``)
    and a ``site-packages``. Returns (the environment, the mark)."""
    env, mark = root / "venv", root / "ran"
    real = write_runtime_shim(root / "real-venv")
    (env / "bin").mkdir(parents=True)
    runtime = env / "bin" / "ddslurm-runtime"
    runtime.write_text(f'#!/bin/sh\necho ran >> {shlex.quote(str(mark))}\nexec {shlex.quote(str(real))} "$@"\n')
    runtime.chmod(0o755)
    interpreter = root / "interp" / "bin" / "python3.11"
    interpreter.parent.mkdir(parents=True)
    interpreter.write_text("#!/bin/sh\nexit 1\n")  # never run: the runtime above is a shell script
    interpreter.chmod(0o755)
    (root / "interp" / "lib" / "python3.11").mkdir(parents=True)
    (env / "bin" / "python").symlink_to(interpreter)
    (env / "lib" / "python3.11" / "site-packages").mkdir(parents=True)
    (env / "lib64").symlink_to("lib")
    return env, mark


def _unit_run(root: Path, recipe: str | None = None) -> tuple[Path, Path, dict[str, str], Path, Path]:
    """The unit run of ``write_unit_run`` with the stand-in environment as its python_env (``recipe``: a builder
    script instead of the config). Returns (run file, profile, environment, python_env, mark)."""
    run, profile, env = write_unit_run(root, "k" * 24)
    python_env, mark = _stand_in_env(root / "envs")
    profile.write_text(profile.read_text().replace("python_env: venv", f"python_env: {python_env}"))
    if recipe is not None:
        (root / "build.py").write_text(recipe)
        run.write_text(run.read_text().replace("recipe: recipe.yaml", "recipe: build.py"))
    return run, profile, env, python_env, mark


def _line(path: Path, key: str) -> int:
    return next(i for i, line in enumerate(path.read_text().splitlines(), 1) if line.startswith(f"{key}:"))


def test_the_projects_environment_and_the_test_stand_ins_are_accepted(tmp_path: Path) -> None:
    """This environment (the repository's ``.venv``: root's, 0755) and the stand-ins the tests write pass."""
    assert python_env_problem(sys.prefix) is None
    assert python_env_problem(write_runtime_shim(tmp_path / "shim").parent.parent) is None
    env, _ = _stand_in_env(tmp_path / "stand-in")
    assert python_env_problem(env) is None
    assert python_env_problem(tmp_path / "no-such-env") is None  # the runtime's absence is reported as such


# Each: what is made writable by others (relative to the directory _stand_in_env gets), and the mode given to it.
WRITABLE = {
    "the environment": ("venv", 0o757, "every user (mode 0757)"),
    "bin": ("venv/bin", 0o775, "group"),
    "the runtime": ("venv/bin/ddslurm-runtime", 0o777, "every user (mode 0777)"),
    "site-packages, sticky": ("venv/lib/python3.11/site-packages", 0o1777, "every user (mode 1777)"),
    "lib/python3.11": ("venv/lib/python3.11", 0o775, "group"),
    "the interpreter's directory": ("interp/bin", 0o777, "every user (mode 0777)"),
    "the standard library": ("interp/lib/python3.11", 0o777, "every user (mode 0777)"),
}


@pytest.mark.parametrize("case", list(WRITABLE))
def test_an_environment_others_can_write_is_named_with_who(tmp_path: Path, case: str) -> None:
    env, _ = _stand_in_env(tmp_path)
    relative, mode, who = WRITABLE[case]
    (tmp_path / relative).chmod(mode)
    problem = python_env_problem(env)
    assert problem is not None and problem.startswith(f"{tmp_path / relative} can be written by {who}"), problem
    assert f"code put there would run as you, with your keys, when ddslurm runs {env}/bin/ddslurm-runtime" in problem
    assert "chmod go-w" in problem


def test_the_directories_on_the_way_may_be_sticky_but_not_open_to_all(tmp_path: Path) -> None:
    """A directory above the environment that others can write lets them rename it aside and put their own in its
    place: refused unless sticky (``/tmp``)."""
    project = tmp_path / "project"
    project.mkdir()
    env, _ = _stand_in_env(project)
    project.chmod(0o1777)
    assert python_env_problem(env) is None
    project.chmod(0o777)
    problem = python_env_problem(env)
    assert problem is not None and problem.startswith(f"{project}: every user (mode 0777) can rename or replace")


@pytest.mark.skipif(os.geteuid() != 0, reason="giving a file to another user needs root")
@pytest.mark.parametrize("relative", ["venv/lib/python3.11/site-packages", "interp/bin/python3.11"])
def test_an_environment_another_user_owns_is_refused(tmp_path: Path, relative: str) -> None:
    """Owned by another user (who may change its mode at will): the site-packages, or the link bin/python leads
    through (its owner can point it elsewhere)."""
    env, _ = _stand_in_env(tmp_path)
    os.lchown(tmp_path / relative, NOBODY, NOBODY)
    problem = python_env_problem(env)
    assert problem is not None and str(tmp_path / relative) in problem and f"nobody (uid {NOBODY})" in problem


def test_doctor_reports_it_at_the_profile_and_runs_nothing_from_it(tmp_path: Path) -> None:
    run, profile, env, python_env, mark = _unit_run(tmp_path)
    report = doctor(profile, slurm=Slurm(Cluster(), user="alice"), env=env)  # the real host: a process
    assert next(c for c in report.checks if c.name == "python_env").status == "ok"
    assert mark.read_text() == "ran\n"  # trusted, it is asked its versions: the mark works
    mark.unlink()
    (python_env / "lib" / "python3.11" / "site-packages").chmod(0o777)
    report = doctor(profile, run, slurm=Slurm(Cluster(), user="alice"), env=env)
    check = next(c for c in report.checks if c.name == "python_env")
    assert check.status == "problem" and check.where == f"{profile}:{_line(profile, 'python_env')}:1"
    assert check.detail.startswith(f"{python_env}/lib/python3.11/site-packages can be written by every user")
    assert not mark.exists()  # nothing in it ran: not the versions, not the run file's compilation


def test_the_dry_run_and_providers_refuse_it_before_a_builder_script_runs(tmp_path: Path) -> None:
    script = (
        "from pathlib import Path\n"
        "Path(__file__).with_name('script-ran').write_text('ran')\n"
        "def load_config_builder():\n    raise SystemExit(1)\n"
    )
    run, profile, env, python_env, mark = _unit_run(tmp_path, recipe=script)
    (python_env / "bin").chmod(0o777)
    with pytest.raises(SubmitError) as refused:
        dry_run(run, profile, slurm=Slurm(Cluster(), user="alice"), env=env)
    place = f"{profile}:{_line(profile, 'python_env')}:1: python_env: {python_env}/bin can be written by every user"
    assert place in str(refused.value)
    with pytest.raises(SubmitError, match=rf"^{place}"):
        describe_aliases(run, env, profile)
    assert not mark.exists() and not (tmp_path / "script-ran").exists()
