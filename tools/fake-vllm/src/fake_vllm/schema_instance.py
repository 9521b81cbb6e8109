"""Generate a valid, seeded instance of a JSON schema (the subset pydantic and Data Designer emit).

Supported: ``type`` (single or a list), ``object`` with ``properties``/``required``/``additionalProperties``,
``array`` with ``items``/``prefixItems``/``minItems``/``maxItems``/``uniqueItems``, ``string`` with
``minLength``/``maxLength`` and common ``format`` values, ``integer``/``number`` with
``minimum``/``maximum``/``exclusiveMinimum``/``exclusiveMaximum`` (draft-4 boolean form too) and
``multipleOf``, ``boolean``, ``null``, ``enum``, ``const``, local ``$ref`` (``#/$defs/...``,
``#/definitions/...``) with sibling keywords, ``allOf`` (merged), ``anyOf``/``oneOf`` (one non-null branch
chosen). ``pattern`` is not honoured. Recursive schemas are cut off at a fixed depth by choosing empty arrays,
null branches and leaving out optional properties.
"""

from __future__ import annotations

import json
import math
import random
import uuid
from collections.abc import Mapping
from typing import Any

from fake_vllm.words import paragraph, words

MAX_DEPTH = 12
_SCALAR_TYPES = ("string", "integer", "number", "boolean")


class SchemaError(ValueError):
    """The schema cannot be instantiated (bad ``$ref``, ``false`` schema, unsatisfiable bounds)."""


def instance_for(schema: Mapping[str, Any] | bool, rng: random.Random) -> Any:
    """A JSON value that validates against ``schema``, drawn from ``rng``."""
    root: Mapping[str, Any] = schema if isinstance(schema, Mapping) else {}
    return _Generator(root, rng).generate(schema, depth=0, name="value")


class _Generator:
    def __init__(self, root: Mapping[str, Any], rng: random.Random) -> None:
        self._root = root
        self._rng = rng

    def generate(self, schema: Mapping[str, Any] | bool, *, depth: int, name: str) -> Any:
        if schema is True:
            return self._string({}, name)
        if schema is False or not isinstance(schema, Mapping):
            raise SchemaError(f"no value satisfies the schema at {name!r}")
        if depth > MAX_DEPTH * 4:
            raise SchemaError("schema nesting too deep (recursive $ref without an exit?)")
        node = self._normalise(schema)
        if "const" in node:
            return node["const"]
        if "enum" in node:
            options = list(node["enum"])
            if not options:
                raise SchemaError(f"empty enum at {name!r}")
            return self._rng.choice(options)
        for key in ("anyOf", "oneOf"):
            if key in node:
                return self.generate(self._pick_branch(node[key], depth), depth=depth + 1, name=name)
        kind = self._type_of(node)
        if kind == "object":
            return self._object(node, depth)
        if kind == "array":
            return self._array(node, depth, name)
        if kind == "integer":
            return self._integer(node)
        if kind == "number":
            return self._number(node)
        if kind == "boolean":
            return self._rng.random() < 0.5
        if kind == "null":
            return None
        return self._string(node, name)

    # -- keyword handling ---------------------------------------------------------------------------

    def _normalise(self, schema: Mapping[str, Any]) -> dict[str, Any]:
        """Resolve ``$ref`` (keeping sibling keywords) and merge ``allOf`` into one flat schema."""
        node = dict(schema)
        seen: set[str] = set()
        while "$ref" in node:
            ref = str(node.pop("$ref"))
            if ref in seen:
                break
            seen.add(ref)
            target = self._resolve(ref)
            node = {**target, **node}
        if "allOf" in node:
            parts = [self._normalise(p) if isinstance(p, Mapping) else {} for p in node.pop("allOf")]
            merged: dict[str, Any] = {}
            for part in [*parts, node]:
                props = {**merged.get("properties", {}), **part.get("properties", {})}
                required = [*merged.get("required", []), *part.get("required", [])]
                merged.update(part)
                if props:
                    merged["properties"] = props
                if required:
                    merged["required"] = list(dict.fromkeys(required))
            node = merged
        return node

    def _resolve(self, ref: str) -> Mapping[str, Any]:
        if not ref.startswith("#"):
            raise SchemaError(f"only local $ref is supported, got {ref!r}")
        target: Any = self._root
        for raw in ref[1:].split("/"):
            if not raw:
                continue
            part = raw.replace("~1", "/").replace("~0", "~")
            if isinstance(target, Mapping) and part in target:
                target = target[part]
            elif isinstance(target, list) and part.isdigit() and int(part) < len(target):
                target = target[int(part)]
            else:
                raise SchemaError(f"unresolvable $ref {ref!r}")
        if not isinstance(target, Mapping):
            raise SchemaError(f"$ref {ref!r} does not point at a schema object")
        return target

    def _pick_branch(self, branches: Any, depth: int) -> Mapping[str, Any] | bool:
        options = [b for b in branches if b is not False] if isinstance(branches, list) else []
        if not options:
            raise SchemaError("anyOf/oneOf without usable branches")
        non_null = [b for b in options if not (isinstance(b, Mapping) and b.get("type") == "null")]
        if depth >= MAX_DEPTH and len(non_null) < len(options):
            return {"type": "null"}
        chosen: Mapping[str, Any] | bool = self._rng.choice(non_null or options)
        return chosen

    def _type_of(self, node: Mapping[str, Any]) -> str:
        declared = node.get("type")
        if isinstance(declared, list):
            non_null = [t for t in declared if t != "null"]
            return str(non_null[0]) if non_null else "null"
        if isinstance(declared, str):
            return declared
        if any(k in node for k in ("properties", "additionalProperties", "required")):
            return "object"
        if any(k in node for k in ("items", "prefixItems", "minItems", "maxItems")):
            return "array"
        if any(k in node for k in ("minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum")):
            return "number"
        return "string"

    # -- types ------------------------------------------------------------------------------------

    def _object(self, node: Mapping[str, Any], depth: int) -> dict[str, Any]:
        properties: Mapping[str, Any] = node.get("properties") or {}
        required = set(node.get("required") or [])
        result: dict[str, Any] = {}
        for key, sub in properties.items():
            if key in required or depth < MAX_DEPTH:
                result[key] = self.generate(sub, depth=depth + 1, name=key)
        for key in sorted(required - set(properties)):
            result[key] = self._string({}, key)
        extra = node.get("additionalProperties")
        wanted = int(node.get("minProperties", 0))
        if not properties and isinstance(extra, Mapping) and depth < MAX_DEPTH:
            wanted = max(wanted, 1)
        index = 0
        while len(result) < wanted:
            index += 1
            key = f"key_{index}"
            if key not in result:
                result[key] = (
                    self.generate(extra, depth=depth + 1, name=key)
                    if isinstance(extra, Mapping)
                    else self._string({}, key)
                )
        return result

    def _array(self, node: Mapping[str, Any], depth: int, name: str) -> list[Any]:
        prefix = node.get("prefixItems")
        items = node.get("items", True)
        if isinstance(items, list):  # draft-4 tuple form
            prefix, items = items, node.get("additionalItems", True)
        prefix_list: list[Any] = list(prefix) if isinstance(prefix, list) else []
        low = int(node.get("minItems", 0))
        high = int(node.get("maxItems", max(low, 3)))
        if items is False:
            high = min(high, len(prefix_list))
        if low > high:
            raise SchemaError(f"cannot build {low} items at {name!r}")
        if depth >= MAX_DEPTH:
            count = low
        else:
            lower = max(low, min(1, high))
            count = self._rng.randint(lower, max(lower, min(high, 3)))
        unique = bool(node.get("uniqueItems"))
        result: list[Any] = []
        seen: set[str] = set()
        attempts = 0
        while len(result) < count:
            position = len(result)
            sub = prefix_list[position] if position < len(prefix_list) else items
            value = self.generate(sub, depth=depth + 1, name=f"{name}[{position}]")
            key = json.dumps(value, sort_keys=True)
            attempts += 1
            if unique and key in seen:
                if attempts > 50 * (count + 1):
                    if len(result) >= low:
                        break
                    raise SchemaError(f"cannot find {low} unique items at {name!r}")
                continue
            seen.add(key)
            result.append(value)
        return result

    def _bounds(self, node: Mapping[str, Any], *, integer: bool) -> tuple[float, float]:
        """Inclusive bounds; exclusive ones are tightened by 1 (integers) or a small step (numbers)."""
        step = 1.0 if integer else 0.01
        low = -math.inf
        high = math.inf
        if "minimum" in node:
            low = float(node["minimum"])
            if node.get("exclusiveMinimum") is True:
                low += step
        if "maximum" in node:
            high = float(node["maximum"])
            if node.get("exclusiveMaximum") is True:
                high -= step
        ex_min = node.get("exclusiveMinimum")
        if isinstance(ex_min, int | float) and not isinstance(ex_min, bool):
            low = max(low, float(ex_min) + step)
        ex_max = node.get("exclusiveMaximum")
        if isinstance(ex_max, int | float) and not isinstance(ex_max, bool):
            high = min(high, float(ex_max) - step)
        if low == -math.inf and high == math.inf:
            low, high = 0.0, 100.0
        elif low == -math.inf:
            low = high - 100.0
        elif high == math.inf:
            high = low + 100.0
        if low > high:
            raise SchemaError("minimum is above maximum")
        return low, high

    def _integer(self, node: Mapping[str, Any]) -> int:
        low_f, high_f = self._bounds(node, integer=True)
        low, high = math.ceil(low_f), math.floor(high_f)
        multiple = node.get("multipleOf")
        if isinstance(multiple, int) and not isinstance(multiple, bool) and multiple > 0:
            first, last = math.ceil(low / multiple), math.floor(high / multiple)
            if first > last:
                raise SchemaError(f"no multiple of {multiple} in [{low}, {high}]")
            return self._rng.randint(first, last) * multiple
        if low > high:
            raise SchemaError(f"no integer in [{low_f}, {high_f}]")
        return self._rng.randint(low, high)

    def _number(self, node: Mapping[str, Any]) -> float | int:
        multiple = node.get("multipleOf")
        if isinstance(multiple, int) and not isinstance(multiple, bool):
            return self._integer(node)
        low, high = self._bounds(node, integer=False)
        if isinstance(multiple, float) and multiple > 0:
            first, last = math.ceil(low / multiple), math.floor(high / multiple)
            if first > last:
                raise SchemaError(f"no multiple of {multiple} in [{low}, {high}]")
            decimals = max(0, -math.floor(math.log10(multiple))) + 2
            return round(self._rng.randint(first, last) * multiple, decimals)
        value = round(self._rng.uniform(low, high), 2)
        return min(max(value, low), high)

    def _string(self, node: Mapping[str, Any], name: str) -> str:
        fmt = node.get("format")
        rng = self._rng
        if fmt == "date-time":
            text = f"2024-{rng.randint(1, 12):02d}-{rng.randint(1, 28):02d}T{rng.randint(0, 23):02d}:00:00Z"
        elif fmt == "date":
            text = f"2024-{rng.randint(1, 12):02d}-{rng.randint(1, 28):02d}"
        elif fmt == "time":
            text = f"{rng.randint(0, 23):02d}:{rng.randint(0, 59):02d}:00Z"
        elif fmt == "email":
            text = f"{rng.choice(words(rng, 3))}{rng.randint(1, 99)}@example.com"
        elif fmt in ("uri", "url", "uri-reference"):
            text = f"https://example.com/{'/'.join(words(rng, 2))}"
        elif fmt == "uuid":
            text = str(uuid.UUID(int=rng.getrandbits(128), version=4))
        elif fmt == "ipv4":
            text = ".".join(str(rng.randint(1, 254)) for _ in range(4))
        else:
            text = (
                paragraph(rng, 4, 16)
                if name.lower() in ("reasoning", "explanation")
                else " ".join(words(rng, rng.randint(1, 4)))
            )
        low = int(node.get("minLength", 0))
        high = int(node.get("maxLength", max(low, len(text))))
        if low > high:
            raise SchemaError(f"minLength > maxLength at {name!r}")
        while len(text) < low:
            text += " " + " ".join(words(rng, 4))
        text = text[:high]
        return text.rstrip() if len(text.rstrip()) >= low else text
