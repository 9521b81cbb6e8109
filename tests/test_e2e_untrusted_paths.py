"""Issue 37 (4 and 5) with a second, unprivileged user (``nobody``) on the same machine.

- ``ddslurm init --dir D`` into a directory ``nobody`` owns, where they planted ``dd-home`` as a symbolic link to a
  directory of theirs (they would then edit the ``model_providers.yaml`` init writes there, and the victim's key
  would go to their endpoint): refused, naming ``D``; nothing is written, in ``D`` or where the link leads. A link
  they planted while the victim's directory was open to all, closed since: refused by name, ``--force`` or not.
- A ``python_env`` whose ``site-packages`` every user can write, where ``nobody`` planted a ``.pth`` file (it runs
  at every start of that Python, as the submitting user, with every key of their shell): ``doctor`` and ``submit
  --dry-run`` refuse it, naming the directory and who can write it, and nothing of it ran. The same ``.pth`` planted
  by the user themself runs when ``doctor`` asks the environment its versions: the proof that it would have.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import sysconfig
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.e2e import NOBODY, REPO, as_nobody, held_run, run_cli

pytestmark = pytest.mark.skipif(
    os.getuid() != 0 or not Path("/usr/bin/python3").exists(), reason="another user needs root"
)

PLANT_LINK = """
import os, sys
directory, leads = sys.argv[1:]
os.makedirs(leads, exist_ok=True)
os.symlink(leads, os.path.join(directory, "dd-home"))
print("planted")
"""
"""What ``nobody`` runs: a link ``dd-home`` in ``directory`` to ``leads``, a directory of theirs."""

PLANT_PTH = """
import pathlib, sys
site, mark = sys.argv[1:]
pathlib.Path(site, "zz-planted.pth").write_text(f"import pathlib; pathlib.Path({mark!r}).write_text('ran')\\n")
print("planted")
"""
"""What ``nobody`` runs: a ``.pth`` file in ``site`` that writes ``mark`` when the Python it belongs to starts."""


@pytest.fixture
def shared() -> Iterator[Path]:
    """A directory both users reach, sticky and writable by all (``/tmp``-like)."""
    folder = Path(tempfile.mkdtemp(prefix="ddslurm-untrusted-", dir="/tmp"))
    folder.chmod(0o1777)
    try:
        yield folder
    finally:
        shutil.rmtree(folder, ignore_errors=True)


def _init(directory: Path, *extra: str) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if k not in {"DATA_DESIGNER_HOME", "DDSLURM_PROFILE"}}
    return run_cli("init", "--example", "hosted", "--dir", str(directory), *extra, env=env, timeout=120)


def test_init_refuses_a_directory_of_another_user_and_a_link_they_planted(shared: Path) -> None:
    theirs, their_home = shared / "theirs", shared / "their-dd-home"
    as_nobody(f"import os; os.mkdir({str(theirs)!r}, 0o755)")
    assert as_nobody(PLANT_LINK, str(theirs), str(their_home)) == "planted"
    done = _init(theirs)
    assert done.returncode == 1, done.stdout
    assert f"{theirs}: its owner nobody (uid {NOBODY}) can write in this directory; nothing was written" in done.stderr
    assert "Give --dir a directory of your own" in done.stderr
    assert [p.name for p in theirs.iterdir()] == ["dd-home"] and list(their_home.iterdir()) == []

    # The victim's own directory, open to all for a while (nobody planted a link then), closed since.
    mine = shared / "mine"
    mine.mkdir()
    mine.chmod(0o777)
    assert as_nobody(PLANT_LINK, str(mine), str(shared / "their-other-dd-home")) == "planted"
    mine.chmod(0o755)
    for force in ((), ("--force",)):
        done = _init(mine, *force)
        assert done.returncode == 1, done.stdout
        assert (
            f"{mine / 'dd-home'}: is a symbolic link (to {shared / 'their-other-dd-home'}): init never writes through "
            "one; nothing was written" in done.stderr
        )
        assert [p.name for p in mine.iterdir()] == ["dd-home"]
        assert list((shared / "their-other-dd-home").iterdir()) == []


def _python_env(root: Path) -> Path:
    """A virtual environment that runs the workspace's ddslurm-runtime (a ``.pth`` file adds this environment's
    site-packages); returns its site-packages."""
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(root)], check=True, timeout=120)
    (site,) = (root / "lib").glob("python*/site-packages")
    (site / "workspace.pth").write_text(f"import site; site.addsitedir({sysconfig.get_paths()['purelib']!r})\n")
    runtime = root / "bin" / "ddslurm-runtime"
    runtime.write_text(
        f"#!{root / 'bin' / 'python'}\nimport sys\nfrom ddslurm.runtime.cli import main\nsys.exit(main())\n"
    )
    runtime.chmod(0o755)
    return site


def _python_env_check(profile: Path, env: dict[str, str]) -> tuple[int, dict[str, str]]:
    done = run_cli("doctor", "--profile", str(profile), "--json", env=env, timeout=300)
    checks = {c["name"]: c for c in json.loads(done.stdout)["checks"]}
    return done.returncode, checks["python_env"]


@pytest.mark.slurm
def test_doctor_and_the_dry_run_refuse_a_python_env_others_can_write_and_run_nothing_from_it(
    shared: Path, tmp_path: Path
) -> None:
    python_env = shared / "env"
    site = _python_env(python_env)
    run, profile, env = held_run(tmp_path / "run", shards=1)
    profile.write_text(profile.read_text().replace(str(REPO / ".venv"), str(python_env)))
    mark = shared / "planted-code-ran"

    # A .pth of the user's own runs when doctor asks the environment its versions: a planted one would too.
    (site / "zz-own.pth").write_text(f"import pathlib; pathlib.Path({str(mark)!r}).write_text('ran')\n")
    code, check = _python_env_check(profile, env)
    assert check["status"] == "ok", check
    assert mark.read_text() == "ran"
    mark.unlink()
    (site / "zz-own.pth").unlink()

    site.chmod(0o777)  # the mistake: a shared environment every user can write
    assert as_nobody(PLANT_PTH, str(site), str(mark)) == "planted"
    code, check = _python_env_check(profile, env)
    assert code == 1 and check["status"] == "problem" and check["where"].startswith(f"{profile}:")
    assert check["detail"].startswith(f"{site} can be written by every user (mode 0777): code put there would run")
    assert "chmod go-w" in check["detail"]
    done = run_cli("submit", str(run), "--profile", str(profile), "--dry-run", env=env, timeout=300)
    assert done.returncode == 2 and f"{site} can be written by every user (mode 0777)" in done.stderr, done.stderr
    assert not mark.exists()  # nothing of the environment ran, the planted .pth included
    assert not (tmp_path / "run" / "work").exists()
