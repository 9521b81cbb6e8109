"""``make gpu-smoke``: ddslurm against a real vLLM on one GPU, in at most eight minutes (docs/serving.md, "GPU smoke
test"). ``python -m tools.gpu_smoke --help``; the checks are :mod:`tools.gpu_smoke.checks`, the pieces they are made
of (``vllm serve --help`` parsed, the token scanner, the rendered flags) beside it, unit-tested in
``tests/test_gpu_smoke.py``."""
