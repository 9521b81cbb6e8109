"""frozen_imports: the collector is off while the block imports, what is alive afterwards is frozen, and the
collector is back as it was (each case in a fresh interpreter: freezing is process-wide)."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

CASE = """
import gc, json, weakref
from ddslurm.config import frozen_imports
if {start_disabled}:
    gc.disable()
class Built:  # stands for what an import builds: a class in a reference cycle with its instances' type
    pass
inside = []
with frozen_imports():
    inside.append(gc.isenabled())
    built = [Built() for _ in range(1000)]
frozen = not any(o is built[0] for o in gc.get_objects())
class Later:
    pass
later = Later()
later.me = later  # a cycle the run makes afterwards: still collected
gone = []
weakref.finalize(later, gone.append, True)
del later
gc.collect()
print(json.dumps({{"inside": inside[0], "after": gc.isenabled(), "frozen": frozen, "count": gc.get_freeze_count(),
                  "later_collected": gone == [True]}}))
"""


def _run(start_disabled: bool) -> dict[str, object]:
    code = CASE.format(start_disabled=start_disabled)
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=60)
    result: dict[str, object] = json.loads(done.stdout.splitlines()[-1])
    return result


@pytest.mark.parametrize("start_disabled", [False, True])
def test_the_block_runs_without_the_collector_and_leaves_it_as_it_was(start_disabled: bool) -> None:
    got = _run(start_disabled)
    assert got["inside"] is False
    assert got["after"] is (not start_disabled)


def test_what_the_block_built_is_frozen_and_what_comes_later_is_still_collected() -> None:
    got = _run(False)
    assert got["frozen"] is True
    assert isinstance(got["count"], int) and got["count"] >= 1000
    assert got["later_collected"] is True
