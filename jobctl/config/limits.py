"""The limits of what a recipe or inventory may be: its size, nesting, nodes once aliases are
expanded, and the depth and length of its `${...}` interpolations (docs/security.md: parsers
have limits). Each is checked before the structure is built, and said as a file:line issue."""

from __future__ import annotations

import os
import re
from pathlib import Path

from jobctl.config.validation import _dotted, _where_in
from jobctl.errors import ConfigIssue

# `launch` is resolved at submit time, when the plan exists: its strings may say ${plan.tp}.
DEFERRED_KEYS = ("launch",)

# A recipe or inventory is a few kilobytes. These bounds keep a hostile or broken file from
# taking the machine with it before any check runs: the "billion laughs" shape (aliases of
# aliases, each expanding nine-fold), nesting deep enough to exhaust Python's recursion,
# interpolation chains that double a string at every step, and a path that is a device.

MAX_BYTES = 256 * 1024  # the file, read at most this far
MAX_DEPTH = 64  # nested mappings/lists
MAX_NODES = 100_000  # scalars, mappings and lists once every alias is expanded
MAX_INTERPOLATION_DEPTH = 16  # ${a} -> ${b} -> ...
MAX_INTERPOLATED_CHARS = 64 * 1024  # one string once its ${...} are replaced

_FAST = None


def _fast_loader():
    """libyaml's loader when PyYAML has it (10x faster on the limits' scan); messages come
    from the pure-Python one."""
    global _FAST
    if _FAST is None:
        import yaml

        _FAST = getattr(yaml, "CSafeLoader", yaml.SafeLoader)
    return _FAST


def read_bounded(path: Path) -> str:
    """A YAML file's text: a regular file (not a device, a pipe or a socket), at most
    MAX_BYTES, UTF-8. OSError/UnicodeDecodeError as from Path.read_text; ValueError with a
    message for the two limits."""
    import stat

    fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK)  # a FIFO must not block the open
    with os.fdopen(fd, "rb") as f:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise ValueError("is not a regular file (a device, a pipe or a socket); give the path to a YAML file")
        data = f.read(MAX_BYTES + 1)
    if len(data) > MAX_BYTES:
        raise ValueError(f"is larger than {MAX_BYTES // 1024} KiB, the limit for a recipe or inventory; "
                         "a recipe is a few kilobytes: split it with `base:` or remove what is not jobctl's")
    return data.decode("utf-8")


def _limit_issue(text: str, shown: str) -> ConfigIssue | None:
    """The first limit the YAML text breaks (depth, then alias expansion), with its line."""
    import yaml

    loader = _fast_loader()
    opens = (yaml.BlockMappingStartToken, yaml.BlockSequenceStartToken, yaml.FlowMappingStartToken,
             yaml.FlowSequenceStartToken)
    closes = (yaml.BlockEndToken, yaml.FlowMappingEndToken, yaml.FlowSequenceEndToken)
    # The depth is measured by the scanner the parser will use (the pure-Python one), or by
    # libyaml's where both read the text to its end: where libyaml stops early on a text the
    # pure-Python parser goes on reading, that parser's recursive composer could meet nesting
    # no scan measured (100,000 '[' crashed it on PyYAML 6.0.4).
    for scan_with in dict.fromkeys((loader, yaml.SafeLoader)):
        depth = 0
        try:
            for token in yaml.scan(text, Loader=scan_with):  # the scanner is iterative: no recursion here
                if isinstance(token, opens):
                    depth += 1
                    if depth > MAX_DEPTH:
                        return ConfigIssue(shown, token.start_mark.line + 1, "",
                                           f"nested more than {MAX_DEPTH} levels deep; a recipe needs a handful")
                elif isinstance(token, closes):
                    depth -= 1
            break  # read to the end: the depth holds for both parsers
        except yaml.YAMLError:
            continue  # measured up to the error only: measure again with the pure-Python scanner
    else:
        return None  # a syntax error for both scanners: reported with its line by the parser
    try:
        root = yaml.compose(text, Loader=loader)
    except yaml.YAMLError:
        return None  # a syntax error: reported with its line by the parser
    if root is None:
        return None
    size: dict[int, int] = {}

    def expanded(node) -> int:  # an alias is the same node object: count it each time it is used
        if id(node) in size:
            return size[id(node)]
        n = 1
        if isinstance(node, yaml.SequenceNode):
            n += sum(expanded(v) for v in node.value)
        elif isinstance(node, yaml.MappingNode):
            n += sum(expanded(k) + expanded(v) for k, v in node.value)
        size[id(node)] = n = min(n, MAX_NODES + 1)
        return n

    if expanded(root) > MAX_NODES:
        line = _first_alias_line(text)
        return ConfigIssue(shown, line, "", f"expands to more than {MAX_NODES:,} values once its aliases (*name) are "
                                            "followed; write the values out or use fewer nested aliases")
    return None


def _first_alias_line(text: str) -> int | None:
    import yaml

    try:
        for event in yaml.parse(text, Loader=_fast_loader()):
            if isinstance(event, yaml.AliasEvent):
                return event.start_mark.line + 1
    except yaml.YAMLError:
        pass
    return None


_REF = re.compile(r"\$\{([A-Za-z_][\w\-]*(?:\.[\w\-]+|\[\d+\])*)\}")


def _interpolation_issues(node, file: str, lines: dict) -> list[ConfigIssue]:
    """Interpolation chains too deep or strings that would grow too long once resolved
    (`a1: ${a0}${a0}`, `a2: ${a1}${a1}`, ...), found on the raw strings before omegaconf
    resolves anything. Only plain `${key.path}` references are followed; resolvers
    (`${oc.env:X}`) are short."""
    from omegaconf import OmegaConf

    raw = OmegaConf.to_container(node, resolve=False)
    strings: dict[tuple, str] = {}

    def collect(value, path):
        if isinstance(value, dict):
            for k, v in value.items():
                if not (path == () and k in DEFERRED_KEYS):
                    collect(v, path + (k,))
        elif isinstance(value, list):
            for i, v in enumerate(value):
                collect(v, path + (i,))
        elif isinstance(value, str) and "${" in value:
            strings[path] = value

    collect(raw, ())
    if not strings:
        return []

    def lookup(ref: str):
        cur = raw
        for part in _key_path(ref):
            try:
                cur = cur[part]
            except (KeyError, IndexError, TypeError):
                return None
        return cur

    memo: dict[str, tuple[int, int]] = {}  # ref -> (chars, depth), only when measured to the end

    def measure(text: str, seen: tuple) -> tuple[int, int, bool]:
        """(characters once resolved, interpolation depth, exact): capped at the limits; a
        result cut short by a limit is not exact and is not remembered."""
        chars, depth, exact = len(text), 0, True
        for m in _REF.finditer(text):
            ref = m.group(1)
            if ref in seen or len(seen) >= MAX_INTERPOLATION_DEPTH:  # a loop, or too deep to follow further
                return chars, MAX_INTERPOLATION_DEPTH + 1, False
            if ref in memo:
                sub_chars, sub_depth = memo[ref]
            else:
                target = lookup(ref)
                if isinstance(target, str):
                    sub_chars, sub_depth, sub_exact = measure(target, seen + (ref,))
                    exact = exact and sub_exact
                    if sub_exact:
                        memo[ref] = (sub_chars, sub_depth)
                else:
                    sub_chars, sub_depth = (64 if isinstance(target, (dict, list)) else len(str(target))), 0
            chars += sub_chars - len(m.group(0))
            depth = max(depth, sub_depth + 1)
            if chars > MAX_INTERPOLATED_CHARS or depth > MAX_INTERPOLATION_DEPTH:
                return min(chars, MAX_INTERPOLATED_CHARS + 1), min(depth, MAX_INTERPOLATION_DEPTH + 1), False
        return chars, depth, exact

    issues = []
    for path, text in strings.items():
        chars, depth, _ = measure(text, ())
        f, line = _where_in(lines, path, file)
        if depth > MAX_INTERPOLATION_DEPTH:
            issues.append(ConfigIssue(f, line, _dotted(path), f"interpolation nested more than "
                                      f"{MAX_INTERPOLATION_DEPTH} levels deep (or a loop); refer to the value directly"))
        elif chars > MAX_INTERPOLATED_CHARS:
            issues.append(ConfigIssue(f, line, _dotted(path), f"would be longer than {MAX_INTERPOLATED_CHARS // 1024} "
                                      "KiB once its ${...} are replaced; interpolate fewer or shorter values"))
        if len(issues) >= 5:
            break
    return issues


def _key_path(dotted: str) -> tuple:
    """'partitions[0].nodes' / 'partitions.0.nodes' -> ('partitions', 0, 'nodes')."""
    parts = [p for p in re.split(r"[.\[\]]+", dotted) if p]
    return tuple(int(p) if p.isdigit() else p for p in parts)
