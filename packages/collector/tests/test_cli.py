"""``ddslurm-collect`` (the Slurm job's entry point): exit codes, and SIGTERM unwinding without a traceback."""

from __future__ import annotations

import signal
import subprocess
import sys
from pathlib import Path

import pyarrow as pa
import pytest

from ddslurm.collector import EXIT_FAILED, EXIT_UNREADABLE, collect_command
from ddslurm.collector.cli import main
from ddslurm.collector.testing import blocked_stderr, make_published_run

COLLECT = Path(sys.executable).parent / "ddslurm-collect"


def test_sigterm_unwinds_removes_staging_and_prints_no_traceback(tmp_path: Path) -> None:
    layout = make_published_run(tmp_path, [[pa.table({"a": [i]}) for i in range(3)]])
    # stderr is a full pipe: the first progress line (after the first batch) blocks the collection half-way.
    with blocked_stderr() as pipe:
        proc = subprocess.Popen([str(COLLECT), str(layout.root)], stderr=pipe.write_fd, stdout=subprocess.DEVNULL)
        pipe.child_started()
        assert pipe.wait_for(lambda: any(layout.root.glob(".dataset.staging-*")), proc), "collection never started"
        proc.send_signal(signal.SIGTERM)
        err = pipe.drain()
        rc = proc.wait(timeout=30)
    assert rc == 128 + signal.SIGTERM, err
    assert "Traceback" not in err and "KeyboardInterrupt" not in err, err
    assert "interrupted" in err and "nothing was published" in err
    assert not list(layout.root.glob(".dataset.staging-*"))
    assert not layout.dataset.exists()


def test_exit_codes(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    conflict = make_published_run(tmp_path / "conflict", [[pa.table({"a": [1]})], [pa.table({"a": ["x"]})]])
    assert main([str(conflict.root)]) == EXIT_FAILED == 1
    assert "error: column 'a'" in capsys.readouterr().err
    unreadable = make_published_run(tmp_path / "unreadable", [[pa.table({"a": [1]})]])
    unreadable.plan.write_text("{")
    assert main([str(unreadable.root)]) == EXIT_UNREADABLE == 2
    assert "run.json" in capsys.readouterr().err


def test_collect_command_prints_the_result_as_json(tmp_path: Path) -> None:
    import io
    import json

    layout = make_published_run(tmp_path, [[pa.table({"a": [1, 2]})]])
    out, err = io.StringIO(), io.StringIO()
    assert collect_command(layout, overwrite=False, as_json=True, out=out, err=err) == 0
    got = json.loads(out.getvalue())
    assert got["rows"] == 2 and got["dataset"] == str(layout.dataset) and got["manifest"].endswith("_manifest.json")


def test_sigterm_right_after_publication_says_the_dataset_is_complete(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A SIGTERM (scancel) that lands as the dataset is renamed into place is held until the collection knows
    it published: it never reports 'nothing was published' over a dataset that exists."""
    import io
    import os

    from ddslurm.collector import _command, _merge

    layout = make_published_run(tmp_path, [[pa.table({"a": [i]}) for i in range(3)]])
    real_publish = _merge._publish

    def publish_then_signal(staging: Path, destination: Path, overwrite: bool) -> None:
        real_publish(staging, destination, overwrite)
        os.kill(os.getpid(), signal.SIGTERM)  # arrives the instant the rename is done

    monkeypatch.setattr(_merge, "_publish", publish_then_signal)
    out, err = io.StringIO(), io.StringIO()
    code = _command.collect_command(layout, out=out, err=err)
    assert layout.dataset.is_dir()
    assert code == 0, err.getvalue()
    assert "nothing was published" not in err.getvalue()
    assert "SIGTERM arrived after the dataset was published" in err.getvalue()
