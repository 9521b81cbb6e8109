#!/usr/bin/env python3
"""Write docs/reference.md, the field reference of the run file and the cluster profile, from the msgspec Structs
of ``ddslurm.config`` (their fields, types, defaults and attribute docstrings).

    uv run python tools/gen_reference.py          # (re)write docs/reference.md
    uv run python tools/gen_reference.py --check  # exit 1 when docs/reference.md differs from what it would write

``tests/test_docs.py`` and ``make docs`` run the check, so the committed page cannot drift from the code.
"""

from __future__ import annotations

import argparse
import ast
import inspect
import re
import sys
import textwrap
from pathlib import Path
from typing import Any

import msgspec
import msgspec.inspect as mi

import ddslurm.config
from ddslurm.config import ClusterProfile, RunFile
from ddslurm.config._runfile import Collection, Deployment, HostedLimit, ServerSpec, Submission

ROOT = Path(__file__).resolve().parent.parent
OUTPUT = ROOT / "docs" / "reference.md"

SECTIONS: tuple[tuple[str, type[msgspec.Struct], str], ...] = (
    ("The run file", RunFile, "run.yaml"),
    ("`deployments[]`", Deployment, "deployments: [...]"),
    ("`deployments[].server`", ServerSpec, "deployments[i].server"),
    ("`submission`", Submission, "submission"),
    ("`collection`", Collection, "collection"),
    ("`hosted_limits.<provider>`", HostedLimit, "hosted_limits: {PROVIDER: ...}"),
    ("The cluster profile", ClusterProfile, "profile.yaml"),
)
"""Every Struct a user writes, in page order: the title, the Struct and where its fields sit in the file."""

_ANCHORS = {Deployment: "deployments", ServerSpec: "deploymentsserver", Submission: "submission",
            Collection: "collection", HostedLimit: "hosted_limitsprovider"}  # fmt: skip


def attribute_docs(cls: type) -> dict[str, str]:
    """The attribute docstrings of ``cls``: the string literal that follows each annotated field in its source."""
    tree = ast.parse(textwrap.dedent(inspect.getsource(cls)))
    body = tree.body[0].body if isinstance(tree.body[0], ast.ClassDef) else []
    docs: dict[str, str] = {}
    for node, after in zip(body, [*body[1:], None], strict=True):
        if (
            isinstance(node, ast.AnnAssign)
            and isinstance(node.target, ast.Name)
            and isinstance(after, ast.Expr)
            and isinstance(after.value, ast.Constant)
            and isinstance(after.value.value, str)
        ):
            docs[node.target.id] = inspect.cleandoc(after.value.value)
    return docs


def markdown(text: str) -> str:
    """A docstring as one Markdown table cell: RST literals and roles as code, one line, pipes escaped outside code
    (inside a code span, Python-Markdown's tables take a pipe as it is and would show the backslash)."""
    text = re.sub(r":(?:func|class|data|meth|attr):`~?([^`]+)`", r"`\1`", text)
    text = text.replace("``", "`")
    text = re.sub(r"\bNone\b", "`null`", text)
    text = " ".join(text.split())
    parts = text.split("`")
    return "`".join(part if i % 2 else part.replace("|", "\\|") for i, part in enumerate(parts))


def type_text(t: mi.Type) -> str:
    """How a field's type reads in the reference."""
    if isinstance(t, mi.UnionType):
        return " or ".join(type_text(u) for u in t.types)
    if isinstance(t, mi.NoneType):
        return "`null`"
    if isinstance(t, mi.LiteralType):
        return " \\| ".join(f"`{v}`" for v in t.values)
    if isinstance(t, mi.IntType):
        bounds = []
        if t.ge is not None:
            bounds.append(f"≥ {t.ge}")
        if t.gt is not None:
            bounds.append(f"> {t.gt}")
        if t.le is not None:
            bounds.append(f"≤ {t.le}")
        if t.lt is not None:
            bounds.append(f"< {t.lt}")
        return "int" + (f" {', '.join(bounds)}" if bounds else "")
    if isinstance(t, mi.StrType):
        return "string" + (f" matching `{t.pattern}`" if t.pattern else "")
    if isinstance(t, mi.VarTupleType | mi.ListType):
        return f"list of {type_text(t.item_type)}"
    if isinstance(t, mi.DictType):
        return f"mapping of {type_text(t.key_type)} to {type_text(t.value_type)}"
    if isinstance(t, mi.StructType):
        return f"mapping ([`{t.cls.__name__}`](#{_ANCHORS.get(t.cls, t.cls.__name__.lower())}))"
    if isinstance(t, mi.BoolType):
        return "bool"
    if isinstance(t, mi.FloatType):
        return "number"
    if isinstance(t, mi.AnyType):
        return "any value"
    return type(t).__name__


def default_text(field: mi.Field) -> str:
    if field.required:
        return "**required**"
    if field.default_factory is not msgspec.NODEFAULT:
        value: Any = field.default_factory()
        if isinstance(value, msgspec.Struct):
            return "all defaults"
    else:
        value = field.default
    if value is None:
        return "`null`"
    if isinstance(value, tuple | list):
        return "`[]`" if not value else f"`{list(value)}`"
    if isinstance(value, dict):
        return "`{}`" if not value else f"`{value}`"
    if isinstance(value, str):
        return f'`"{value}"`' if value else '`""`'
    return f"`{value}`"


def section(title: str, cls: type[msgspec.Struct], where: str) -> list[str]:
    info = mi.type_info(cls)
    assert isinstance(info, mi.StructType)
    docs = attribute_docs(cls)
    out = [f"## {title}", ""]
    if cls.__doc__:
        out += [markdown(inspect.cleandoc(cls.__doc__)), ""]
    public = "ddslurm.config" if getattr(ddslurm.config, cls.__name__, None) is cls else cls.__module__
    out += [f"Generated from `{public}.{cls.__name__}`; its fields sit in `{where}`.", ""]
    out += ["| Field | Type | Default | Meaning |", "|---|---|---|---|"]
    for field in info.fields:
        meaning = markdown(docs.get(field.name, ""))
        out.append(f"| `{field.encode_name}` | {type_text(field.type)} | {default_text(field)} | {meaning} |")
    return [*out, ""]


def render() -> str:
    lines = [
        "# Reference: run file and cluster profile",
        "",
        "<!-- GENERATED by tools/gen_reference.py from the msgspec Structs of ddslurm.config: do not edit by hand.",
        "     Change the Struct (its fields, defaults and attribute docstrings), then run",
        "     `uv run python tools/gen_reference.py`; tests/test_docs.py fails while this page differs. -->",
        "",
        "Every field a run file (`run.yaml`) and a cluster profile (`profile.yaml`) accept, as the loader checks them:",
        "an unknown key, a wrong type or a value outside its bounds is refused with the file, line, column and field",
        "(`run.yaml:8:7: deployments[0].server.port: expected int | null, got str`). Times such as `12:00:00` load",
        "as written (YAML 1.2); `null` is YAML's null. `uv run ddslurm-config check FILE --kind run|profile` prints",
        "a file with every default filled in. What the fields do, with examples: [run-files.md](run-files.md).",
        "",
    ]
    for title, cls, where in SECTIONS:
        lines += section(title, cls, where)
    return "\n".join(lines).rstrip("\n") + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--check", action="store_true", help="exit 1 if the committed page differs")
    args = parser.parse_args(argv)
    text = render()
    if args.check:
        current = OUTPUT.read_text() if OUTPUT.exists() else ""
        if current != text:
            print(
                f"{OUTPUT.relative_to(ROOT)} is out of date: run `uv run python tools/gen_reference.py`",
                file=sys.stderr,
            )
            return 1
        return 0
    OUTPUT.write_text(text)
    print(f"wrote {OUTPUT.relative_to(ROOT)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
