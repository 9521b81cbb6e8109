"""MkDocs hooks of the docs site (mkdocs.yml ``hooks:``).

Pages link to repository files outside ``docs/`` the way GitHub shows them (``../examples/local-profile.yaml``).
The site copies each such file to ``repo/<path>`` and points the link there, so ``mkdocs build --strict`` checks
that the file exists instead of refusing every link that leaves ``docs/``.

Code blocks that draw (box-drawing characters) are marked ``diagram``, with their longest line as ``--cols``: the
site's stylesheet (docs/stylesheets/extra.css) fits their font to the page, where every other code block keeps its
lines and scrolls.

Inline code breaks between its words, never inside one: each word (a run without white space) of a code span up to
``TOKEN_CHARS`` long is put in a ``<span class="tok">`` that the stylesheet keeps on one line (a reason code, an
option, a field name), so a table's column is at least as wide as its longest code word; a longer word (a path) may
still break where a phone's line ends.
"""

from __future__ import annotations

import html
import re
from pathlib import Path
from typing import Any

from mkdocs.structure.files import File, Files

ROOT = Path(__file__).resolve().parent.parent
DOCS = ROOT / "docs"
_LINK = re.compile(r"\]\((\.\./[^)#\s]+)(#[^)\s]*)?\)")
_CODE = re.compile(r"<pre>(<span></span><code>(.*?)</code></pre>)", re.S)
_DRAWING = frozenset("┌┐└┘├┤┬┴┼─│═║╔╗╚╝")
_PRE = re.compile(r"<pre\b.*?</pre>", re.S)
_INLINE_CODE = re.compile(r"<code>([^<]*)</code>")
_WORD = re.compile(r"\S+")
TOKEN_CHARS = 24
"""The longest code word kept on one line (every reason code, option and field name): about 200 CSS pixels of the
site's code font, so that a table of them still fits a desktop's page and a cell a phone's line."""


def _outside(page: Path, target: str) -> Path | None:
    """The repository file a relative link of ``page`` names, when it lies outside docs/ and exists."""
    path = (page.parent / target).resolve()
    if path.is_relative_to(DOCS) or not path.is_relative_to(ROOT) or not path.is_file():
        return None
    return path


def on_files(files: Files, config: Any) -> Files:
    added: set[Path] = set()
    for page in sorted(DOCS.rglob("*.md")):
        for match in _LINK.finditer(page.read_text()):
            path = _outside(page, match.group(1))
            if path is not None and path not in added:
                added.add(path)
                rel = path.relative_to(ROOT).as_posix()
                files.append(File.generated(config, f"repo/{rel}", abs_src_path=str(path)))
    return files


def on_page_markdown(markdown: str, page: Any, config: Any, files: Files) -> str:
    source = DOCS / page.file.src_uri
    depth = "../" * (len(Path(page.file.src_uri).parts) - 1)

    def rewrite(match: re.Match[str]) -> str:
        path = _outside(source, match.group(1))
        if path is None:
            return match.group(0)
        return f"]({depth}repo/{path.relative_to(ROOT).as_posix()}{match.group(2) or ''})"

    return _LINK.sub(rewrite, markdown)


def _mark_drawing(match: re.Match[str]) -> str:
    text = html.unescape(re.sub(r"<[^>]+>", "", match.group(2)))
    if not _DRAWING & set(text):
        return match.group(0)
    cols = max(len(line) for line in text.splitlines())
    return f'<pre class="diagram" style="--cols: {cols}">{match.group(1)}'


def _keep_words(match: re.Match[str]) -> str:
    """An inline code span with each of its words up to TOKEN_CHARS long in a ``tok`` span."""

    def word(found: re.Match[str]) -> str:
        text = found.group(0)
        return f'<span class="tok">{text}</span>' if len(html.unescape(text)) <= TOKEN_CHARS else text

    return f"<code>{_WORD.sub(word, match.group(1))}</code>"


def _inline_code_words(html_text: str) -> str:
    """``_keep_words`` on every inline code span (outside ``<pre>``: a code block keeps its lines anyway)."""
    parts, at = [], 0
    for block in _PRE.finditer(html_text):
        parts += [_INLINE_CODE.sub(_keep_words, html_text[at : block.start()]), block.group(0)]
        at = block.end()
    return "".join([*parts, _INLINE_CODE.sub(_keep_words, html_text[at:])])


def on_page_content(html_text: str, page: Any, config: Any, files: Files) -> str:
    return _inline_code_words(_CODE.sub(_mark_drawing, html_text))
