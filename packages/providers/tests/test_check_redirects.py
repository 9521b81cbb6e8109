"""``providers --check`` never follows a redirect: the key goes to the endpoint the provider names and nowhere
else, and a redirected endpoint is a failed check that names where it pointed (never ``ok``)."""

from __future__ import annotations

import json
import os
import shutil
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

from ddslurm.providers import check_endpoints, describe_run
from ddslurm.providers.cli import main

EXAMPLE = Path(__file__).resolve().parents[3] / "examples" / "hosted-only"
EXAMPLE_ENDPOINT = "http://127.0.0.1:18400/v1"
KEY_ENV = "DEMO_HOSTED_API_KEY"
KEY = "sk-redirect-" + "3b7d2e4f6a8c0b1d5e1f0a9c"
MODELS = {"object": "list", "data": [{"id": "demo/writer-8b"}, {"id": "demo/judge-70b"}]}


class Server:
    """A loopback HTTP server in a thread that records every request's path and headers."""

    def __init__(self, answer: tuple[int, dict[str, str], bytes]) -> None:
        self.requests: list[tuple[str, dict[str, str]]] = []
        outer = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                outer.requests.append((self.path, {k.lower(): v for k, v in self.headers.items()}))
                status, headers, body = answer
                self.send_response(status)
                for name, value in headers.items():
                    self.send_header(name, value)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *_: object) -> None:
                pass

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.port = self.httpd.server_address[1]
        self.origin = f"http://127.0.0.1:{self.port}"
        self.thread = threading.Thread(target=self.httpd.serve_forever, daemon=True)
        self.thread.start()

    def close(self) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()
        self.thread.join()


@pytest.fixture
def target() -> Iterator[Server]:
    """The other host: it would list the models and accept any key."""
    server = Server((200, {"Content-Type": "application/json"}, json.dumps(MODELS).encode()))
    yield server
    server.close()


def _redirector(location: str) -> Server:
    return Server((302, {"Location": location}, b""))


def _run_file(tmp_path: Path, endpoint: str, monkeypatch: pytest.MonkeyPatch) -> Path:
    """The hosted-only example, its provider's endpoint ``endpoint``."""
    shutil.copytree(EXAMPLE, tmp_path / "run", ignore=shutil.ignore_patterns("dd-home"))
    home = tmp_path / "dd-home"
    home.mkdir()
    providers = (EXAMPLE / "dd-home" / "model_providers.yaml").read_text()
    assert EXAMPLE_ENDPOINT in providers
    (home / "model_providers.yaml").write_text(providers.replace(EXAMPLE_ENDPOINT, endpoint))
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    monkeypatch.setenv("DATA_DESIGNER_HOME", str(home))
    monkeypatch.setenv(KEY_ENV, KEY)
    return tmp_path / "run" / "run.yaml"


def test_a_redirect_to_another_origin_gets_no_key_and_fails_the_check(
    tmp_path: Path, target: Server, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    redirector = _redirector(f"{target.origin}/v1/models?from=redirect")
    try:
        run = _run_file(tmp_path, f"{redirector.origin}/v1", monkeypatch)
        checked = check_endpoints(describe_run(run, os.environ), os.environ, timeout=5)
        rc = main([str(run), "--check", "--json", "--timeout", "5"])
    finally:
        redirector.close()
    out = capsys.readouterr()

    # The endpoint the provider names was asked (with the key, as Data Designer would send it) ...
    assert [path for path, _ in redirector.requests] == ["/v1/models", "/v1/models"]
    assert all(headers["authorization"] == f"Bearer {KEY}" for _, headers in redirector.requests)
    # ... and the origin it redirected to never was: no request at all, so no Authorization header.
    assert target.requests == []
    assert not any("authorization" in headers for _, headers in target.requests)

    want = f"redirected to {target.origin} (HTTP 302; not followed, the key was not sent there)"
    assert [row.check for row in checked.rows] == [want, want]
    assert rc == 1
    assert {row["check"] for row in json.loads(out.out)["aliases"]} == {want}
    assert KEY not in out.out + out.err
    assert "from=redirect" not in out.out  # the origin only, never the path or query it pointed to


def test_a_redirect_within_the_endpoints_origin_is_not_followed_either(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    redirector = _redirector("/v2/models")
    try:
        run = _run_file(tmp_path, f"{redirector.origin}/v1", monkeypatch)
        checked = check_endpoints(describe_run(run, os.environ), os.environ, timeout=5)
    finally:
        redirector.close()
    assert [path for path, _ in redirector.requests] == ["/v1/models"]
    want = f"redirected to {redirector.origin} (HTTP 302; not followed, the key was not sent there)"
    assert [row.check for row in checked.rows] == [want, want]
