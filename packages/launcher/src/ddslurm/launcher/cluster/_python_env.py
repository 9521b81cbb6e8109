"""The profile's ``python_env`` is refused when another user can write it, before anything in it runs.

The submit host runs ``<python_env>/bin/ddslurm-runtime`` with the user's environment (``doctor`` asks its versions,
``submit`` and its dry run and ``providers`` run a builder script and Data Designer's checks there), and the nodes
run it with the run's keys. Whoever can write that environment runs their code as the user: a ``.pth`` file in its
``site-packages`` runs at every start of its Python, a replaced ``bin/ddslurm-runtime`` or ``bin/python`` runs
instead of ddslurm's. So :func:`python_env_problem` judges, with :mod:`~ddslurm.launcher.cluster._trust`'s words, and
``doctor`` (its ``python_env`` check, which ``submit`` and the dry run also run first) and ``prepare`` (``submit``,
its dry run, ``tune``) and ``providers`` refuse before running anything from it, when a user other than the
submitter and root can write (owns, or may write as its group or as every user: a sticky bit does not help here):

- the environment's directory (the directories on the way to it may be sticky, as ``/tmp`` is);
- ``bin/``, ``bin/ddslurm-runtime`` and ``bin/python``, and for each of them that is a symbolic link what it leads
  to (the interpreter's file, its directory and the directories on the way);
- ``lib/`` (``lib64/`` when it is a directory of its own), each ``lib/python3.*/`` and its ``site-packages/``, and
  the base interpreter's standard library (``<its directory>/../lib/python3.*/``, where ``site.py`` is).

Not judged (each is the user's own choice, or costs a Python start to find): ``PYTHONPATH`` and other variables of
the shell, directories a ``.pth`` file adds, the base installation's ``site-packages`` (a virtual environment made
with ``--system-site-packages`` reads it) and the shared libraries the interpreter loads.
"""

from __future__ import annotations

import os
import stat
from pathlib import Path

from ddslurm.config import UnsafePathError
from ddslurm.launcher.cluster._trust import MAX_LINKS, lstat_of, others_can_write, resolve_trusted, user_name

RUNTIME = "ddslurm-runtime"
INTERPRETER = "python"


def _judge(path: Path, uid: int, hops: int = 0) -> str | None:
    """Who else can write ``path``, in words with the path; None when nobody, or when nothing is there. A symbolic
    link: its owner, then each link it leads through (the directories on the way included), then what it leads to
    and the directory that holds it."""
    st = lstat_of(path)
    if st is None:
        return None
    if not stat.S_ISLNK(st.st_mode):
        who = others_can_write(st, uid)
        return None if who is None else f"{path} can be written by {who}"
    if st.st_uid not in (uid, 0):
        return f"{path} is a symbolic link its owner, {user_name(st.st_uid)}, can replace"
    if hops >= MAX_LINKS:
        return f"{path}: more than {MAX_LINKS} symbolic links"
    leads = path.parent / path.readlink()
    try:
        if leads.name in ("", ".", ".."):
            real, missing = resolve_trusted(leads, uid=uid)
            target = real
        else:
            real, missing = resolve_trusted(leads.parent, uid=uid)
            target = real / leads.name
    except UnsafePathError as exc:
        return f"{exc} (on the way to {leads}, where {path} leads)"
    if missing:
        return None  # leads nowhere: running it fails, and says so
    for entry in (target.parent, target):
        found = _judge(entry, uid, hops + 1)
        if found is not None:
            return f"{found} (where {path} leads)"
    return None


def _entries(env: Path) -> list[Path]:
    """What :func:`python_env_problem` judges in the environment ``env`` (a real path), in order."""
    bin_dir, lib = env / "bin", env / "lib"
    entries = [env, bin_dir, bin_dir / RUNTIME, bin_dir / INTERPRETER, lib, env / "lib64"]
    versions = sorted(lib.glob("python3*")) if lib.is_dir() else []
    for version in versions:
        entries += [version, version / "site-packages"]
    interpreter = bin_dir / INTERPRETER
    if interpreter.exists():
        base = Path(os.path.realpath(interpreter)).parent.parent / "lib"
        entries += [base / version.name for version in versions]
    return entries


def python_env_problem(python_env: str | Path, *, uid: int | None = None) -> str | None:
    """Why another user than ``uid`` (this process's effective one) and root could change what ``python_env``
    runs, with the path and who, and what to do; None when nobody can (or when it does not exist: the caller says
    that). Reads only: nothing in it runs."""
    uid = os.geteuid() if uid is None else uid
    try:
        real, missing = resolve_trusted(Path(python_env), uid=uid)
    except UnsafePathError as exc:
        found: str | None = f"{exc}, on the way to {python_env}"
    else:
        if missing:
            return None
        found = next((f for f in (_judge(entry, uid) for entry in _entries(real)) if f is not None), None)
    if found is None:
        return None
    return (
        f"{found}: code put there would run as you, with your keys, when ddslurm runs {python_env}/bin/{RUNTIME}. "
        "Use a Python environment only you (or root) can write: remove the others' write access (chmod go-w) if "
        "it is yours, or make your own (python3 -m venv, uv venv) and install ddslurm-runtime in it"
    )


def runtime_command(python_env: str | Path) -> Path:
    """``<python_env>/bin/ddslurm-runtime``: what the nodes run, and what the submit host asks about a recipe."""
    return Path(python_env) / "bin" / RUNTIME


def runtime_problem(python_env: str | Path) -> str | None:
    """Why ``python_env``'s runtime must not be run or asked (:func:`python_env_problem`), or cannot be (it does
    not exist); None when it may. Reads only: nothing in it runs."""
    untrusted = python_env_problem(python_env)
    if untrusted is not None:
        return untrusted
    runtime = runtime_command(python_env)
    return None if runtime.exists() else f"{runtime} does not exist (the compute nodes run it)"
