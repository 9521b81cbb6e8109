"""Helpers for tests and benchmarks of packages built on the contracts (like Go's ``httptest``).

Not used by production code; importing it has no side effects.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import msgspec

from ddslurm.config._files import proc_locks
from ddslurm.config._plan import Plan, Resources, ShardSpec
from ddslurm.config._secret_policy import KEY_PREFIXES


def make_plan(run_id: str = "run-1", shard_rows: tuple[int, ...] = (2,), **overrides: Any) -> Plan:
    """A valid plan with contiguous shards of ``shard_rows`` records; any field can be overridden."""
    shards, first = [], 0
    for index, rows in enumerate(shard_rows):
        shards.append(ShardSpec(index=index, first_record=first, num_records=rows))
        first += rows
    resources = Resources(time_minutes=10)
    plan = Plan(
        run_id=run_id,
        run_name="test",
        num_records=first,
        shards=tuple(shards),
        resume="never",
        buffer_size=max(shard_rows),
        recipe_file="-",
        recipe_sha256="-",
        snapshot_file="-",
        snapshot_sha256="-",
        secret_env=(),
        python_env="-",
        generation=resources,
        collection=resources,
    )
    return msgspec.structs.replace(plan, **overrides) if overrides else plan


def lock_waiters(path: Path) -> int:
    """How many ``flock`` requests wait for the lock file ``path`` now (``->`` lines of ``/proc/locks``)."""
    return sum(parts[1] == "->" for parts in proc_locks(path.stat()))


def wait_for_lock_waiter(path: Path, bound_s: float = 60.0) -> None:
    """Return once a request waits for the lock file ``path``: the event that proves a blocking lock is waiting for
    its holder, not done and not refused. The bound only keeps a waiter that never came from hanging the test
    (an ``AssertionError`` then); nothing asserts how long it took."""
    deadline = time.monotonic() + bound_s
    while lock_waiters(path) == 0:
        if time.monotonic() >= deadline:
            raise AssertionError(f"no request waited for the lock {path} within {bound_s:g} s")
        time.sleep(0.01)


_KEY_BODY = "Zq3Vb8Kd9Lm2Np4Rt6Wx"  # 20 letters and digits, as after a GitLab token's prefix
_AWS_BODY = "IOSFODNN7EXAMPLE"

LITERAL_CREDENTIALS: dict[str, str] = {
    **{f"prefix {p}": p + (_AWS_BODY if p[-1].isalpha() else _KEY_BODY) for p in KEY_PREFIXES},
    "auth scheme": "bearer 0f1e2d3c4b5a6978",
    "URL with credentials": "https://user:s3cr3t-pass@hub.example/v1",
    "key after a separator": "upstream=glpat-" + _KEY_BODY,
    "AWS key id after a separator": "id:ASIA" + _AWS_BODY,
    "JWT after a separator": "session.eyJhbGciOiJIUzI1NiJ9.eyJzdWIiOiIxIn0.c2ln",
    "generated key": "Zq3Vb8Kd9Lm2Np4Rt6Wx1Yz5",
}
"""One value for each sign of a literal credential in the secret policy (:func:`~ddslurm.config.credential_shape`)
that holds wherever a value is judged, by what it shows; one for each of :data:`~ddslurm.config.KEY_PREFIXES`, so
a prefix added there is tested in every place. Every place that judges a value by its shape refuses each of them."""

ID_LIKE_CREDENTIALS: dict[str, str] = {
    "git revision": "2c2b3f7d0e1a4b5c6d7e8f9a0b1c2d3e4f5a6b7c",
    "hex run": "sha=a8f5f167f44f4964e6c998dee827110c",
    "letters and digits run": "k9x2tlc3vwzxjzzwnyzxrrzxkxmjm0ntyz+q",
    "all-capitals key": "LIVEKEY7F3A9C0D1E2B55",
}
"""Values that look like a key only where long identifiers are not ordinary: refused in a provider's headers,
``extra_body`` and endpoint query and among the shell's variables, kept in ``server.env``, ``server.extra_args``
and an MCP server's ``env`` and arguments (``credential_shape(..., ids_ordinary=True)``)."""

NOT_CREDENTIALS: dict[str, str] = {
    "variable name": "NVIDIA_API_KEY",
    "capitals word holding a prefix": "EAST_ASIA_PACIFIC",
    "model": "meta-llama/Llama-3.1-8B-Instruct",
    "model name": "Llama-3-70B-Instruct",
    "path holding a prefix": "/scratch/hf_cache",
    "UUID": "550e8400-e29b-41d4-a716-446655440000",
    "date": "2024-06-01",
    "word": "info",
    "media type": "application/json",
    "endpoint": "https://integrate.api.nvidia.com/v1",
    "plain words": "a-story-about-three-llamas",
}
"""Values the secret policy keeps: every place that judges a value by its shape accepts each of them."""


def parse_only(app: Any, argv: list[str], *, prog: str) -> None:
    """Parse ``argv`` as the command line of ``app`` (a Typer app's click group: ``typer.main.get_command``) and
    its command, run nothing: every option and argument checked, every value converted; raises the app's usage
    error (``typer.TyperException``) where the line does not parse. What a documented example is tested with."""
    with app.make_context(prog, list(argv)) as ctx:
        name, command, rest = app.resolve_command(ctx, [*ctx._protected_args, *ctx.args])
        with command.make_context(name, rest, parent=ctx):
            pass
