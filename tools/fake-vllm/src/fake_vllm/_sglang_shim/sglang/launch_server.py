"""``python -m sglang.launch_server ARGS``: the fake-vllm stand-in with SGLang's command line, API-key rules and
metrics (``fake_vllm.cli.sglang_main``)."""

import sys

from fake_vllm.cli import sglang_main

if __name__ == "__main__":
    sys.exit(sglang_main(sys.argv[1:]))
