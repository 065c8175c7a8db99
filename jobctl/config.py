"""Read recipes and inventories: YAML through omegaconf, validated by pydantic, file:line errors.

The only module that reads YAML. Features: `${...}` interpolation, `key=value` overrides,
`base: other.yaml` inheritance, and every problem reported at once as
`file:line: key.path: what was wrong; what is allowed`.
"""

from __future__ import annotations

import difflib
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from jobctl.errors import ConfigError, ConfigIssue

CLI = "<command line>"
# `launch` is resolved at submit time, when the plan exists: its strings may say ${plan.tp}.
DEFERRED_KEYS = ("launch",)


@dataclass
class Loaded:
    """A validated document plus where each key came from (for messages and the job folder)."""

    path: str
    value: Any  # the pydantic model
    data: dict  # resolved plain data (launch left unresolved)
    raw: Any  # the merged omegaconf node before resolution (for ${plan.*} later)
    lines: dict[tuple, tuple[str, int]] = field(default_factory=dict)


def _line_map(text: str, file: str) -> dict[tuple, tuple[str, int]]:
    """Map each key path to (file, 1-based line) using PyYAML's composed node tree."""
    import yaml

    out: dict[tuple, tuple[str, int]] = {}
    root = yaml.compose(text, Loader=yaml.SafeLoader)

    def walk(node, path):
        if isinstance(node, yaml.MappingNode):
            for k, v in node.value:
                p = path + (str(k.value),)
                out[p] = (file, k.start_mark.line + 1)
                walk(v, p)
        elif isinstance(node, yaml.SequenceNode):
            for i, v in enumerate(node.value):
                p = path + (i,)
                out[p] = (file, v.start_mark.line + 1)
                walk(v, p)

    if root is not None:
        out[()] = (file, 1)
        walk(root, ())
    return out


def _read_yaml(path: Path, issues: list[ConfigIssue]):
    """Parse one file into an omegaconf node; syntax errors become issues with their line."""
    import yaml
    from omegaconf import OmegaConf

    shown = str(path)
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        issues.append(ConfigIssue(shown, None, "", "file not found; check the path (recipes live in recipes/, inventories in clusters/)"))
        return None, {}
    except (OSError, UnicodeDecodeError) as e:
        issues.append(ConfigIssue(shown, None, "", f"cannot read the file: {e}"))
        return None, {}
    try:
        lines = _line_map(text, shown)
        data = yaml.safe_load(text)
    except yaml.YAMLError as e:
        mark = getattr(e, "problem_mark", None)
        line = mark.line + 1 if mark else None
        problem = getattr(e, "problem", None) or str(e).splitlines()[0]
        issues.append(ConfigIssue(shown, line, "", f"YAML syntax error: {problem}; fix the indentation or quoting there"))
        return None, {}
    if data is None:
        data = {}
    if not isinstance(data, dict):
        issues.append(ConfigIssue(shown, 1, "", f"expected a mapping of keys at the top level, got {type(data).__name__}"))
        return None, {}
    try:
        node = OmegaConf.create(data)
    except Exception as e:  # omegaconf rejects e.g. non-string keys
        issues.append(ConfigIssue(shown, 1, "", f"cannot load: {e}"))
        return None, {}
    return node, lines


def _load_chain(path: Path, issues: list[ConfigIssue], seen: tuple = ()):
    """Load `path` and, recursively, the file its `base:` key names; merge base under it."""
    from omegaconf import OmegaConf

    node, lines = _read_yaml(path, issues)
    if node is None:
        return None, lines
    base = node.get("base") if "base" in node else None
    if base is not None:
        if not isinstance(base, str):
            issues.append(ConfigIssue(str(path), lines.get(("base",), (None, None))[1], "base", "expected a file path string"))
            return None, lines
        base_path = (path.parent / os.path.expanduser(base)).resolve()
        if base_path in seen:
            issues.append(ConfigIssue(str(path), lines.get(("base",), (None, None))[1], "base", f"circular base: {base_path} extends itself"))
            return None, lines
        base_node, base_lines = _load_chain(base_path, issues, seen + (path.resolve(),))
        if base_node is None:
            return None, lines
        del node["base"]
        node = OmegaConf.merge(base_node, node)
        lines = {**base_lines, **lines}
        lines.pop(("base",), None)
    return node, lines


def apply_overrides(node, overrides: list[str], lines: dict, issues: list[ConfigIssue]):
    """Merge `key=value` strings (omegaconf dot-list syntax) on top of a document."""
    from omegaconf import OmegaConf

    for item in overrides:
        if "=" not in item or item.startswith("="):
            issues.append(ConfigIssue(CLI, None, item, "expected key=value, e.g. train.global_batch_size=512"))
            continue
        try:
            node = OmegaConf.merge(node, OmegaConf.from_dotlist([item]))
        except Exception as e:
            issues.append(ConfigIssue(CLI, None, item.split("=", 1)[0], f"cannot apply override: {e}"))
            continue
        key = tuple(item.split("=", 1)[0].split("."))
        lines[key] = (CLI, 0)
    return node


def _resolve(node, file: str, lines: dict, issues: list[ConfigIssue]) -> dict | None:
    from omegaconf import OmegaConf

    out = {}
    for key in node:
        try:
            if key in DEFERRED_KEYS:
                out[key] = OmegaConf.to_container(node[key], resolve=False)
            else:
                out[key] = _resolve_key(node, key)
        except Exception as e:
            f, line = lines.get((str(key),), (file, None))
            msg = str(e).splitlines()[0]
            issues.append(ConfigIssue(f, line, str(key), f"cannot resolve interpolation: {msg}"))
    return out


def _resolve_key(node, key):
    from omegaconf import OmegaConf

    value = node[key]
    if OmegaConf.is_config(value):
        return OmegaConf.to_container(value, resolve=True)
    return value


def _where(lines: dict, loc: tuple, file: str) -> tuple[str, int | None]:
    """The most specific known line for a key path (walk up until one is known)."""
    loc = tuple(loc)
    while loc:
        if loc in lines:
            return lines[loc]
        loc = loc[:-1]
    return lines.get((), (file, None))


def _describe(err: dict, model_cls) -> str:
    """Turn one pydantic error into 'what was wrong; what is allowed'."""
    kind = err["type"]
    got = err.get("input")
    loc = err["loc"]
    if kind == "extra_forbidden":
        allowed = _allowed_keys(model_cls, loc[:-1])
        close = difflib.get_close_matches(str(loc[-1]), allowed, n=1, cutoff=0.6)
        hint = f"; did you mean {close[0]!r}?" if close else ""
        return f"unknown key{hint} (allowed here: {', '.join(allowed)})"
    if kind == "missing":
        return "required key is missing; add it"
    if kind == "literal_error":
        expected = err.get("ctx", {}).get("expected", "")
        close = difflib.get_close_matches(str(got), [s.strip(" '") for s in expected.replace(" or ", ",").split(",")], n=1, cutoff=0.6)
        hint = f"; did you mean {close[0]!r}?" if close else ""
        return f"got {got!r}{hint}; allowed: {expected}"
    msg = err["msg"]
    if msg.startswith("Value error, "):
        msg = msg[len("Value error, "):]
    return f"{msg} (got {got!r})" if got is not None and not isinstance(got, dict) else msg


def _allowed_keys(model_cls, path: tuple) -> list[str]:
    """Field names of the pydantic model found at `path` (for "allowed here" lists)."""
    cls = model_cls
    for part in path:
        if isinstance(part, int) or cls is None:
            continue
        f = cls.model_fields.get(part)
        if f is None:
            return []
        cls = _model_in(f.annotation)
    return sorted(cls.model_fields) if cls is not None else []


def _model_in(annotation):
    from typing import get_args

    from pydantic import BaseModel

    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return annotation
    for arg in get_args(annotation):
        m = _model_in(arg)
        if m is not None:
            return m
    return None


def _clean_loc(loc: tuple) -> tuple:
    """Drop pydantic's union-branch markers (e.g. 'ModelArch', 'int', "literal['auto']")."""
    out = []
    for part in loc:
        if isinstance(part, str) and (part[:1].isupper() or part in ("int", "str", "bool", "float") or "[" in part):
            continue
        out.append(part)
    return tuple(out)


def validate(data: dict, model_cls, file: str, lines: dict) -> Any:
    """Validate plain data with a pydantic model; raise ConfigError listing every problem."""
    from pydantic import ValidationError

    try:
        return model_cls.model_validate(data)
    except ValidationError as e:
        issues = []
        seen = set()
        for err in e.errors():
            loc = _clean_loc(err["loc"])
            key = ".".join(str(p) for p in loc)
            if err["type"] in ("string_type", "model_type", "dict_type") and any(
                i.key == key for i in issues
            ):
                continue
            text = _describe(err, model_cls)
            if (key, text) in seen:
                continue
            seen.add((key, text))
            f, line = _where(lines, loc, file)
            issues.append(ConfigIssue(f, line, key, text))
        raise ConfigError(_merge_union_issues(issues)) from None


def _merge_union_issues(issues: list[ConfigIssue]) -> list[ConfigIssue]:
    """A value that fails every branch of `int | 'auto'` yields one issue per branch: join them."""
    merged: dict[tuple, ConfigIssue] = {}
    for i in issues:
        k = (i.file, i.line, i.key)
        if k in merged:
            prev = merged[k]
            merged[k] = ConfigIssue(i.file, i.line, i.key, f"{prev.problem}; or {i.problem}")
        else:
            merged[k] = i
    return list(merged.values())


def _plain_document(path: Path, overrides) -> tuple[dict, dict] | None:
    """The parsed document when omegaconf would return it unchanged: no overrides, no
    `base:`, no `${...}` outside the deferred keys. Otherwise None (take the full path)."""
    import yaml

    if overrides:
        return None
    try:
        text = path.read_text(encoding="utf-8")
        data = yaml.safe_load(text)
    except (OSError, UnicodeDecodeError, yaml.YAMLError):
        return None  # the full path reports the problem with its line
    if not isinstance(data, dict) or "base" in data:
        return None
    if any("${" in s for k, v in data.items() if k not in DEFERRED_KEYS for s in _strings(v)):
        return None
    if not all(isinstance(k, str) for k in data):
        return None
    return data, _line_map(text, str(path))


def _strings(value):
    if isinstance(value, str):
        yield value
    elif isinstance(value, dict):
        for k, v in value.items():
            yield str(k)
            yield from _strings(v)
    elif isinstance(value, list):
        for v in value:
            yield from _strings(v)


def load(path: str | Path, model_cls, overrides: list[str] | None = None) -> Loaded:
    """Load, merge, override, resolve and validate one recipe or inventory file."""
    p = Path(path)
    issues: list[ConfigIssue] = []
    fast = _plain_document(p, overrides)
    if fast is not None:  # nothing for omegaconf to do: skip its import (start-up time)
        data, lines = fast
        value = validate(data, model_cls, str(p), lines)
        return Loaded(str(p), value, data, None, lines)
    node, lines = _load_chain(p, issues)
    if node is None:
        raise ConfigError(issues)
    node = apply_overrides(node, overrides or [], lines, issues)
    data = _resolve(node, str(p), lines, issues)
    if issues:
        raise ConfigError(issues)
    value = validate(data, model_cls, str(p), lines)
    return Loaded(str(p), value, data, node, lines)
