"""``python -m tools.gpu_smoke [--vllm PATH] [--model NAME] [--json] [--keep DIR] [--total S] [--no-gpu-check]``
(``make gpu-smoke VLLM=path MODEL=name``): the checks of :mod:`tools.gpu_smoke.checks` against a real vLLM on this
machine's GPU, one line each as it ends (``PASS|FAIL|SKIP N name (seconds): detail``), then a summary; ``--json``
prints one JSON document instead.

Exit status:

- 0: every check passed; or the machine cannot run the test at all (no NVIDIA GPU, or no ``vllm`` executable),
  which the summary says (``gpu-smoke: skipped: ...``): a CPU-only CI machine stays green;
- 1: a check failed;
- 2: a bad command line;
- 3: incomplete: the machine could run the test but some checks were skipped (no model: ``--model`` not given and
  a tiny one could not be made without ``transformers``).

``--no-gpu-check`` runs the checks without looking for a GPU: the seam the tests use to run the plumbing against
the stand-in (``--vllm`` naming ``fake-vllm``, ``FAKE_VLLM_ENGINE_PROCESS=1`` for check 4).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
from collections.abc import Mapping
from pathlib import Path

from tools.gpu_smoke.checks import CHECKS, Budget, Result, Smoke, describe, run_checks, scratch
from tools.gpu_smoke.tinymodel import ModelUnavailable, make_tiny_model

TOTAL_S = 480.0
"""The whole run's deadline: eight minutes."""
EXIT_OK, EXIT_FAILED, EXIT_USAGE, EXIT_INCOMPLETE = 0, 1, 2, 3


def gpu_absent(env: Mapping[str, str]) -> str | None:
    """Why this machine has no NVIDIA GPU to test on (``nvidia-smi -L`` lists none), else None."""
    smi = shutil.which("nvidia-smi", path=env.get("PATH"))
    if smi is None:
        return "no nvidia-smi on PATH (no NVIDIA driver)"
    try:
        out = subprocess.run([smi, "-L"], capture_output=True, text=True, timeout=30, check=False)
    except (OSError, subprocess.TimeoutExpired) as exc:
        return f"nvidia-smi -L failed ({exc})"
    if out.returncode != 0 or "GPU " not in out.stdout:
        return f"nvidia-smi -L lists no GPU (exit {out.returncode}: {(out.stdout + out.stderr).strip()[:200]})"
    return None


def find_vllm(given: str, env: Mapping[str, str]) -> str | None:
    """The vLLM executable: a path, or a name looked up on PATH."""
    found = (
        (given if os.access(given, os.X_OK) else None) if os.sep in given else shutil.which(given, path=env.get("PATH"))
    )
    return None if found is None else str(Path(found).absolute())


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="gpu-smoke", description="ddslurm against a real vLLM on one GPU (docs/serving.md, GPU smoke test)"
    )
    p.add_argument("--vllm", default="vllm", help="vLLM's executable, a path or a name on PATH (default: vllm)")
    p.add_argument(
        "--model", default=None, help="what vllm serve loads (a path or a hub id; default: a tiny model made here)"
    )
    p.add_argument("--json", action="store_true", help="print one JSON document instead of lines")
    p.add_argument("--keep", type=Path, default=None, help="work in this directory and keep it (logs, run)")
    p.add_argument("--total", type=float, default=TOTAL_S, help=f"the whole run's deadline, seconds ({TOTAL_S:.0f})")
    p.add_argument(
        "--runtime", type=Path, default=Path(sys.executable).parent / "ddslurm-runtime", help=argparse.SUPPRESS
    )
    p.add_argument(
        "--skip", action="append", default=[], choices=[name for name, _ in CHECKS], help="do not run this check"
    )
    p.add_argument("--no-gpu-check", action="store_true", help="do not look for a GPU (tests with the stand-in)")
    return p


def main(argv: list[str], env: Mapping[str, str] | None = None) -> int:
    args = parser().parse_args(argv)
    environ = dict(os.environ if env is None else env)
    emit = (lambda _r: None) if args.json else (lambda r: print(r.line(), flush=True))
    why_not = None if args.no_gpu_check else gpu_absent(environ)
    vllm = find_vllm(args.vllm, environ)
    if why_not is None and vllm is None:
        why_not = f"no vLLM executable {args.vllm!r} (VLLM=path names one)"
    if why_not is not None:
        results = run_checks(None, Budget(args.total), {name: why_not for name, _ in CHECKS}, emit)
        return _finish(args.json, results, f"skipped: {why_not}", EXIT_OK)
    assert vllm is not None
    budget = Budget(args.total)
    with scratch(args.keep) as work:
        skip = {name: "skipped by --skip" for name in args.skip}
        model = args.model
        if model is None:
            try:
                model = str(make_tiny_model(work / "tiny-model"))
            except ModelUnavailable as exc:
                reason = f"no model: MODEL= not given and a tiny one cannot be made here: {exc}"
                skip = {name: reason for name, _ in CHECKS if name != "flags"} | skip
        smoke = Smoke(vllm=vllm, model=model or "", work=work, runtime_exe=args.runtime, env=environ)
        results = run_checks(smoke, budget, skip, emit)
    failed = [r for r in results if r.status == "FAIL"]
    skipped = [r for r in results if r.status == "SKIP"]
    if failed:
        return _finish(args.json, results, f"FAILED: {', '.join(r.name for r in failed)}", EXIT_FAILED)
    if skipped:
        return _finish(args.json, results, f"incomplete: skipped {', '.join(r.name for r in skipped)}", EXIT_INCOMPLETE)
    return _finish(args.json, results, f"all {len(results)} checks passed", EXIT_OK)


def _finish(as_json: bool, results: list[Result], summary: str, code: int) -> int:
    if as_json:
        print(json.dumps({**describe(results), "summary": summary, "exit": code}, indent=2))
    else:
        print(f"gpu-smoke: {summary}")
    return code
