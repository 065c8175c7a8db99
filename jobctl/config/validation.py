"""pydantic validation errors as `file:line: key.path: what was wrong; what is allowed`.

The line comes from the YAML node map config.py builds; union branches (`int | 'auto'`,
`str | ModelArch`) are merged into one message; did-you-mean for literals and keys.
"""

from __future__ import annotations

import re
from typing import Any, Callable

from jobctl.errors import ConfigIssue

CLI = "<command line>"  # the "file" of key=value overrides
MISSING = "???"  # omegaconf's "must be given" marker
Where = Callable[[tuple], tuple]  # key path -> (file, line): the most specific known place


def _dotted(path: tuple) -> str:
    return ".".join(str(p) for p in path)


def _where_in(lines: dict, loc: tuple, file: str) -> tuple[str, int | None]:
    """The most specific known line for a key path (walk up until one is known)."""
    loc = tuple(loc)
    while loc:
        if loc in lines:
            return lines[loc]
        loc = loc[:-1]
    return lines.get((), (file, None))


def _members(annotation) -> list:
    """The alternatives of a Union (Optional's None dropped); [annotation] otherwise."""
    import types
    from typing import Union, get_args, get_origin

    if get_origin(annotation) in (Union, types.UnionType):
        return [a for a in get_args(annotation) if a is not type(None)]
    return [annotation]


def _is_model(annotation) -> bool:
    from pydantic import BaseModel

    return isinstance(annotation, type) and issubclass(annotation, BaseModel)


def _step(annotation, part):
    """The annotation one level below `annotation` along loc part `part` (None: unknown)."""
    from typing import get_args, get_origin

    if annotation is None:
        return None
    if _is_model(annotation):
        f = annotation.model_fields.get(part)
        return f.annotation if f is not None else None
    origin = get_origin(annotation)
    if origin in (list, tuple, set, frozenset) and isinstance(part, int):
        args = get_args(annotation)
        return args[0] if args else None
    if origin is dict:
        args = get_args(annotation)
        return args[1] if len(args) == 2 else None
    return None


def _branch(members: list, tag: str):
    """Which Union member pydantic's loc tag (e.g. 'int', "literal['auto']",
    'function-after[_shapes(), ModelArch]', 'list[str]') names."""
    from typing import get_origin

    for m in members:
        if _is_model(m) and (tag == m.__name__ or tag.endswith(f" {m.__name__}]") or tag.endswith(f"[{m.__name__}]")):
            return m
        if isinstance(m, type) and tag == m.__name__:
            return m
        origin = get_origin(m)
        if origin is not None and tag.startswith(f"{getattr(origin, '__name__', str(origin)).lower()}["):
            return m
    return None


def _split_loc(model_cls, loc: tuple) -> tuple[tuple, bool]:
    """Drop pydantic's union-branch tags from a loc by walking the schema alongside it.

    Returns (key path, whether the error came from one branch of a Union). Walking the schema
    (rather than guessing from the spelling) keeps user keys such as env `NCCL_DEBUG`."""
    out: list = []
    ann = model_cls
    from_branch = False
    for part in loc:
        members = _members(ann) if ann is not None else []
        if len(members) > 1 and isinstance(part, str):  # a tag naming the branch tried
            from_branch = True
            ann = _branch(members, part)
            continue
        out.append(part)
        ann = _step(members[0] if len(members) == 1 else None, part)
    return tuple(out), from_branch


def _allowed_keys(model_cls, path: tuple) -> list[str]:
    """Field names of the pydantic model found at `path` (for "allowed here" lists)."""
    ann = model_cls
    for part in path:
        ms = _members(ann) if ann is not None else []
        models = [m for m in ms if _is_model(m)]
        ann = _step(models[0] if models else (ms[0] if len(ms) == 1 else None), part)
    ms = [m for m in (_members(ann) if ann is not None else []) if _is_model(m)]
    return sorted(ms[0].model_fields) if ms else []


_SCALAR_TYPES = {
    "int_type": "an integer", "int_parsing": "an integer", "int_from_float": "a whole number",
    "float_type": "a number", "float_parsing": "a number", "bool_type": "true or false",
    "bool_parsing": "true or false", "string_type": "a string", "list_type": "a list",
    "dict_type": "a mapping of keys", "model_type": "a mapping of keys", "model_attributes_type": "a mapping of keys",
}
_BOUNDS = {"greater_than": "greater than {gt}", "greater_than_equal": "at least {ge}",
           "less_than": "less than {lt}", "less_than_equal": "at most {le}"}


def _show(value) -> str:
    if value is None:
        return "an empty value"
    if isinstance(value, bool):
        return "true" if value else "false"
    text = repr(value)  # a message shows what was given, never all of a long value
    return text if len(text) <= 60 else text[:57] + "..."


def _close(value, options: list[str]) -> str | None:
    """The option a typo most likely meant: a close spelling, else a prefix ('bf16' -> 'bf16-mixed')."""
    value = str(value)
    hit = [o for o in options if o.startswith(value)][:1] if len(value) >= 2 else []
    if not hit:
        import difflib  # only a message needs it: not imported by every `plan`

        hit = difflib.get_close_matches(value, options, n=1, cutoff=0.6)
    return hit[0] if hit else None


def _literal_options(expected: str) -> list[str]:
    return [s.strip(" '") for s in expected.replace(" or ", ",").split(",") if s.strip(" '")]


def _describe(err: dict, model_cls, loc: tuple | None = None) -> str:
    """Turn one pydantic error into 'what was wrong; what is allowed'."""
    kind = err["type"]
    got = err.get("input")
    loc = loc if loc is not None else _split_loc(model_cls, err["loc"])[0]
    ctx = err.get("ctx") or {}
    if kind == "extra_forbidden":
        allowed = _allowed_keys(model_cls, loc[:-1])
        close = _close(loc[-1], allowed)
        hint = f"; did you mean {close!r}?" if close else ""
        return f"unknown key{hint} (allowed here: {', '.join(allowed)})"
    if kind == "missing":
        return "required key is missing; add it"
    if got == MISSING:
        return f"is {MISSING!r} (a value that must be given); set it here or on the command line: {_dotted(loc)}=VALUE"
    if kind == "literal_error":
        options = _literal_options(ctx.get("expected", ""))
        close = _close(got, options)
        hint = f"; did you mean {close!r}? allowed" if close else "; allowed"
        return f"got {_show(got)}{hint}: {ctx.get('expected', '')}"
    if kind in _BOUNDS:
        return f"got {_show(got)}; must be {_BOUNDS[kind].format(**ctx)}"
    if kind in _SCALAR_TYPES:
        return f"got {_show(got)}; expected {_SCALAR_TYPES[kind]}"
    if kind == "too_short":
        n = ctx.get("min_length", 1)
        return f"got {_show(got)}; needs at least {n} item{'s' if n != 1 else ''}"
    if kind == "string_too_short":
        return f"got {_show(got)}; must not be empty"
    if kind == "string_too_long":
        return f"got a string of {len(got)} characters; must be at most {ctx.get('max_length')}"
    msg = err["msg"]
    if msg.startswith("Value error, "):
        msg = msg[len("Value error, "):]
    m = re.fullmatch(r"(.+), got (.+)", msg)
    if m:  # "<what is allowed>, got <value>" -> "got <value>; <what is allowed>"
        return f"got {m.group(2)}; {m.group(1)}"
    if "got" in msg or isinstance(got, dict):
        return msg
    return f"{msg} (got {_show(got)})"


def _union_message(errs: list[dict], got) -> str:
    """One message for a scalar that fails every branch of e.g. `int | 'auto'`."""
    allowed: list[str] = []
    literals: list[str] = []
    for err in errs:
        kind = err["type"]
        if kind == "literal_error":
            opts = _literal_options((err.get("ctx") or {}).get("expected", ""))
            literals += opts
            allowed.append(", ".join(repr(o) for o in opts))
        elif kind in _SCALAR_TYPES:
            allowed.append(_SCALAR_TYPES[kind])
        else:
            return "; or ".join(_describe(e, None, ()) for e in errs)
    allowed = list(dict.fromkeys(allowed))
    close = _close(got, literals) if isinstance(got, str) else None
    hint = f"; did you mean {close!r}? allowed" if close else "; allowed"
    return f"got {_show(got)}{hint}: {' or '.join(allowed)}"


def _bool_issues(data, model_cls, where: Where, skip: set) -> list[ConfigIssue]:
    """true/false where a number is expected: pydantic's lax mode would read it as 1/0."""
    out: list[ConfigIssue] = []

    def walk(value, ann, path):
        if path in skip or ann is None:
            return
        members = _members(ann)
        if isinstance(value, bool):
            if bool not in members and any(m in (int, float) for m in members):
                f, line = where(path)
                kinds = " or ".join(["a number" if float in members else "an integer"]
                                    + [repr(a) for m in members for a in _literal_args(m)])
                out.append(ConfigIssue(f, line, _dotted(path), f"got {_show(value)}; expected {kinds}"))
            return
        for m in members:
            if isinstance(value, dict) and _is_model(m):
                for k, v in value.items():
                    walk(v, m.model_fields[k].annotation if k in m.model_fields else None, path + (k,))
                return
            if isinstance(value, (dict, list)) and _step(m, 0 if isinstance(value, list) else "") is not None:
                items = value.items() if isinstance(value, dict) else enumerate(value)
                for k, v in items:
                    walk(v, _step(m, k), path + (k,))
                return

    walk(data, model_cls, ())
    return out


def _literal_args(annotation) -> tuple:
    from typing import Literal, get_args, get_origin

    return get_args(annotation) if get_origin(annotation) is Literal else ()


def _validation_issues(data: dict, model_cls, file: str, lines: dict, skip: set = frozenset()) -> tuple[Any, list]:
    """Validate plain data; return (model or None, issues). Keys in `skip` (already reported,
    e.g. a failed interpolation) and everything below them are left out of the report."""
    from pydantic import ValidationError

    def where(loc):
        return _where_in(lines, loc, file)

    def skipped(loc):
        return any(loc[:len(s)] == s for s in skip)

    try:
        value = model_cls.model_validate(data)
        errors = []
    except ValidationError as e:
        value = None
        errors = e.errors()
    issues: list[ConfigIssue] = []
    # Group the errors of one key: a scalar that fails every branch of a Union yields one
    # error per branch, merged into one message; a mapping given for `str | Model` fails
    # the str branch too, which is noise next to the model's own errors.
    groups: dict[tuple, list[dict]] = {}
    branchy: dict[tuple, bool] = {}
    for err in errors:
        loc, from_branch = _split_loc(model_cls, err["loc"])
        if skipped(loc):
            continue
        groups.setdefault(loc, []).append(err)
        branchy[loc] = branchy.get(loc, False) or from_branch
    for loc, errs in groups.items():
        got = errs[0].get("input")
        if branchy[loc] and isinstance(got, (dict, list)):
            deeper = any(len(k) > len(loc) and k[:len(loc)] == loc for k in groups)
            kept = [e for e in errs if e["type"] not in _SCALAR_TYPES and e["type"] != "literal_error"]
            if deeper or kept:
                errs = kept
            if not errs:
                continue
        if branchy[loc] and len(errs) > 1:
            text = _union_message(errs, got)
        else:
            text = "; ".join(dict.fromkeys(_describe(e, model_cls, loc) for e in errs))
        f, line = where(loc)
        issues.append(ConfigIssue(f, line, _dotted(loc), text))
    issues += _bool_issues(data, model_cls, where, set(skip) | {k for k in groups})
    if issues:
        value = None
    return value, issues


def _ordered(issues: list[ConfigIssue]) -> list[ConfigIssue]:
    """Files in the order they first appear (the command line last), lines in order within one."""
    files: dict[str, int] = {}
    for i in issues:
        files.setdefault(i.file, len(files))
    unique = list(dict.fromkeys(issues))
    return sorted(unique, key=lambda i: (i.file == CLI, files[i.file], i.line or 0))


# --- loading ---------------------------------------------------------------------------------
