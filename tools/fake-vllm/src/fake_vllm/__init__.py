"""fake_vllm: a vLLM stand-in that accepts ``vllm serve``'s command line and speaks the OpenAI API.

Modules: ``cli`` (command line and ``FAKE_VLLM_*`` variables), ``settings``, ``app`` (Starlette endpoints and
the capacity model), ``content`` (deterministic replies), ``schema_instance`` (JSON-schema instances),
``faults``, ``metrics``, ``request_log``, ``server`` (uvicorn), ``testing`` (start a server in tests).
Importing it has no side effects.
"""
