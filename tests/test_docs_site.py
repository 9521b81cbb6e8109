"""The documentation site as a reader sees it: ``mkdocs build --strict`` (what ``make docs`` runs), every page opened
in headless Chromium at a desktop and a phone width. Each page renders (its title, Material's script ran: the copy
button on every code block, nothing on the console) and fits the window (nothing wider than the page but what
scrolls in its own box: a code block, a table). Code blocks keep their lines (a long one scrolls in its box, never
wraps inside a word), and their copy button stands beside the code, never over it; a drawing fits its box. No code
word of inline code (a reason code, an option, a field) is broken across two lines."""

from __future__ import annotations

import functools
import html
import http.server
import json
import os
import re
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from ddslurm.launcher.testing import console_lines, find_chromium, run_chromium

ROOT = Path(__file__).resolve().parents[1]
WIDTHS = (1280, 390)
"""A desktop window and a phone, in CSS pixels."""

HARNESS = """<!doctype html><html><body><pre id="out">pending</pre><script>
const pages = %(pages)s, widths = %(widths)s, results = [];
function check(url, width) {
  return new Promise(resolve => {
    const frame = document.createElement("iframe");
    frame.style.width = width + "px";
    frame.style.height = "900px";
    frame.onload = () => setTimeout(() => {
      const doc = frame.contentDocument;
      const blocks = [...doc.querySelectorAll("article pre > code")].map(code => {
        const nav = code.parentElement.querySelector(".md-code__nav"), box = code.getBoundingClientRect();
        return {
          scroll: code.scrollWidth, client: code.clientWidth, text: code.textContent.slice(0, 120),
          copy: code.parentElement.querySelector("[data-md-type=copy]") !== null,
          wraps: getComputedStyle(code).whiteSpace !== "pre",
          diagram: code.parentElement.classList.contains("diagram"),
          covers: nav !== null && nav.getBoundingClientRect().left < box.right - 1,
        };
      });
      const broken = [...doc.querySelectorAll("article :not(pre) > code")]
        .filter(code => /^\\S+$/.test(code.textContent) && code.textContent.length <= %(token)d
          && code.getClientRects().length > 1)
        .map(code => code.textContent);
      const inline = doc.querySelectorAll("article :not(pre) > code").length;
      const wide = doc.documentElement.scrollWidth > doc.documentElement.clientWidth;
      const title = doc.querySelector("article h1");
      resolve({url, width, title: title ? title.textContent.trim() : "", blocks, broken, inline, wide});
      frame.remove();
    }, 1000);
    frame.src = url;
    document.body.appendChild(frame);
  });
}
(async () => {
  for (const width of widths) for (const page of pages) results.push(await check(page, width));
  document.getElementById("out").textContent = JSON.stringify(results);
})();
</script></body></html>
"""
"""Opens each page in a frame of the given width, measures its code blocks, its inline code and its width, and writes
what it found into #out."""


@pytest.fixture(scope="module")
def site(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("site")
    built = subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "--quiet", "--site-dir", str(out)],
        cwd=ROOT, env={**os.environ, "NO_MKDOCS_2_WARNING": "1"}, capture_output=True, text=True, timeout=300,
        check=False,
    )  # fmt: skip
    assert built.returncode == 0, built.stderr[-3000:]
    return out


@pytest.fixture(scope="module")
def served(site: Path) -> Iterator[str]:
    """The built site over HTTP on loopback (one origin, so the harness can look into its frames)."""

    class Files(http.server.SimpleHTTPRequestHandler):
        def log_message(self, format: str, *args: Any) -> None:
            pass

    class Quiet(http.server.ThreadingHTTPServer):
        def handle_error(self, request: Any, client_address: Any) -> None:  # a frame removed mid-request
            pass

    server = Quiet(("127.0.0.1", 0), functools.partial(Files, directory=str(site)))
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()


def _pages() -> list[str]:
    """Every page of docs/, as the site's URL path (directory URLs: x.md is x/)."""
    return sorted("" if p.stem == "index" else f"{p.stem}/" for p in (ROOT / "docs").glob("*.md"))


@pytest.mark.skipif(find_chromium() is None, reason="chromium is not installed (tools/install-browser)")
def test_every_page_renders_and_keeps_its_code_whole(site: Path, served: str, tmp_path: Path) -> None:
    """Both widths in one browser (one site build, one Chromium start: most of the cost)."""
    pages = [f"/{page}" for page in _pages()]
    harness = "harness.html"
    token = re.search(r"^TOKEN_CHARS = (\d+)$", (ROOT / "tools" / "mkdocs_hooks.py").read_text(), re.M)
    assert token is not None  # the longest code word the site keeps whole
    values = {"pages": json.dumps(pages), "widths": json.dumps(list(WIDTHS)), "token": int(token.group(1))}
    (site / harness).write_text(HARNESS % values)
    done = run_chromium(
        "--virtual-time-budget=600000", "--window-size=1400,1000", "--dump-dom", f"{served}/{harness}",
        cwd=tmp_path, timeout=600,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-2000:]
    found = re.search(r'<pre id="out">(.*?)</pre>', done.stdout, re.S)
    assert found is not None and found.group(1) != "pending", done.stdout[-2000:]
    results = json.loads(html.unescape(found.group(1)))
    assert len(results) == len(pages) * len(WIDTHS) and len(pages) > 10
    assert {r["width"] for r in results} == set(WIDTHS)

    def blocks(key: str, diagram: bool | None = None) -> list[str]:
        return [
            f"{r['url']} at {r['width']}px: {b['text']!r}"
            for r in results
            for b in r["blocks"]
            if b[key] and diagram in (None, b["diagram"])
        ]

    for b in (b for r in results for b in r["blocks"]):
        b["clipped"] = b["scroll"] > b["client"]
    assert blocks("wraps") == [], "code blocks that wrap their lines"
    assert blocks("covers") == [], "copy buttons over a code block's text"
    assert blocks("clipped", diagram=True) == [], "drawings wider than their box"
    assert blocks("clipped", diagram=False), "no code block is wider than its box: the measure measured nothing"
    broken = [f"{r['url']} at {r['width']}px: {code!r}" for r in results for code in r["broken"]]
    assert broken == [], "code words broken across lines"
    assert min(r["inline"] for r in results if r["url"] == "/reasons/") > 50  # the reason codes were measured
    assert [f"{r['url']} at {r['width']}px" for r in results if r["wide"]] == [], "pages wider than the window"
    assert [r["url"] for r in results if not r["title"]] == [], "pages without a title"
    assert sum(len(r["blocks"]) for r in results) > 25 * len(WIDTHS)  # the pages' code blocks were measured
    assert [r["url"] for r in results for b in r["blocks"] if not b["copy"]] == [], "Material's script did not run"
    assert console_lines(done.stderr) == [], "a page logged to the console"
