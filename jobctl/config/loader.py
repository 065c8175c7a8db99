"""Read recipes and inventories: YAML through omegaconf, validated by pydantic, file:line errors.

The only module that reads YAML (with config/limits.py, which bounds it first). Features: `${...}` interpolation, `key=value` overrides,
`base: other.yaml` inheritance, and every problem reported at once as
`file:line: key.path: what was wrong; what is allowed`.
"""

from __future__ import annotations

import os
import re
import shlex
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

from jobctl.config import cache as validcache
from jobctl.config.validation import (
    CLI,
    MISSING,
    Where,
    _dotted,
    _ordered,
    _validation_issues,
    _where_in,
)
from jobctl.config.limits import (
    DEFERRED_KEYS,
    MAX_DEPTH,
    _interpolation_issues,
    _key_path,
    _limit_issue,
    read_bounded,
)
from jobctl.errors import ConfigError, ConfigIssue, UsageError
from jobctl.model import JOB_FOLDER_TOKEN

Check = Callable[[dict, Where], list]  # extra checks on the resolved data -> [ConfigIssue]


@dataclass
class Loaded:
    """A validated document plus where each key came from (for messages and the job folder)."""

    path: str
    value: Any  # the pydantic model
    data: dict  # resolved plain data (launch left unresolved)
    raw: Any  # the merged omegaconf node before resolution (for ${plan.*} later)
    lines: dict[tuple, tuple[str, int]] = field(default_factory=dict)
    notes: tuple[str, ...] = ()  # what the user should know of where it was found (workspace.shadowing)


# --- reading YAML ------------------------------------------------------------------------

def _line_map(text: str, file: str, issues: list[ConfigIssue] | None = None) -> dict[tuple, tuple[str, int]]:
    """Map each key path to (file, 1-based line) using PyYAML's composed node tree.

    A key given twice in one mapping is an issue (PyYAML would silently keep the last)."""
    import yaml

    out: dict[tuple, tuple[str, int]] = {}
    root = yaml.compose(text, Loader=yaml.SafeLoader)

    def walk(node, path):
        if isinstance(node, yaml.MappingNode):
            first: dict[str, int] = {}
            for k, v in node.value:
                name = str(k.value)
                line = k.start_mark.line + 1
                p = path + (name,)
                if name in first and issues is not None and name != "<<":
                    issues.append(ConfigIssue(file, line, ".".join(str(x) for x in p),
                                              f"duplicate key (first given at line {first[name]}); keep one"))
                first.setdefault(name, line)
                out.setdefault(p, (file, line))
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


def _read_text(path: Path, shown: str, at: tuple, issues: list[ConfigIssue]) -> str | None:
    """The file's text, or None with an issue at `at` ((file, line, key) of the reference to it)."""
    ref_file, ref_line, ref_key = at
    try:
        return read_bounded(path)
    except FileNotFoundError:
        what = ("file not found; check the path (recipes live in recipes/, inventories in clusters/)"
                if not ref_key else f"file not found: {shown} (a base path is relative to the file that names it)")
        issues.append(ConfigIssue(ref_file, ref_line, ref_key, what))
    except IsADirectoryError:
        issues.append(ConfigIssue(ref_file, ref_line, ref_key,
                                  f"{shown} is a directory; give the path to a YAML file" if ref_key
                                  else "is a directory; give the path to a YAML file"))
    except PermissionError:
        issues.append(ConfigIssue(ref_file, ref_line, ref_key,
                                  f"cannot read {shown}: permission denied" if ref_key
                                  else "cannot read the file: permission denied; check its mode (chmod +r)"))
    except UnicodeDecodeError as e:
        issues.append(ConfigIssue(shown, None, "", f"not a UTF-8 text file ({e.reason} at byte {e.start}); "
                                                   "save it as UTF-8 YAML"))
    except OSError as e:
        issues.append(ConfigIssue(ref_file, ref_line, ref_key, f"cannot read {shown}: {e.strerror or e}"))
    except ValueError as e:
        issues.append(ConfigIssue(ref_file if ref_key else shown, ref_line if ref_key else None, ref_key,
                                  f"{shown} {e}" if ref_key else str(e)))
    return None


def _read_yaml(path: Path, issues: list[ConfigIssue], shown: str | None = None, at: tuple | None = None):
    """Parse one file into an omegaconf node; syntax errors become issues with their line."""
    import yaml
    from omegaconf import OmegaConf

    shown = shown or str(path)
    text = _read_text(path, shown, at or (shown, None, ""), issues)
    if text is None:
        return None, {}
    limit = _limit_issue(text, shown)
    if limit is not None:
        issues.append(limit)
        return None, {}
    try:
        lines = _line_map(text, shown, issues)
        data = yaml.safe_load(text)
    except yaml.YAMLError as e:
        issues.append(_syntax_issue(e, text, shown))
        return None, {}
    except RecursionError:  # the limits' scan should have caught it: never a traceback
        issues.append(ConfigIssue(shown, None, "", f"nested more than {MAX_DEPTH} levels deep; a recipe needs "
                                                   "a handful"))
        return None, {}
    if data is None:
        data = {}
    if not isinstance(data, dict):
        issues.append(ConfigIssue(shown, 1, "", f"expected a mapping of keys at the top level, got a {type(data).__name__}"))
        return None, {}
    try:
        node = OmegaConf.create(data)
    except Exception as e:  # omegaconf rejects e.g. non-string keys
        issues.append(ConfigIssue(shown, 1, "", f"cannot load: {_first_line(e)}"))
        return None, {}
    return node, lines


def _syntax_issue(e, text: str, shown: str) -> ConfigIssue:
    """A PyYAML error as one issue at the most useful line.

    The problem mark is where the parser gave up; an unclosed quote or bracket is only
    noticed at the end of the file, so then the line where it was opened (the context
    mark) is the one to show."""
    problem_mark = getattr(e, "problem_mark", None)
    context_mark = getattr(e, "context_mark", None)
    problem = getattr(e, "problem", None) or _first_line(e)
    context = getattr(e, "context", None)
    n_lines = max(1, len(text.splitlines()))
    line = problem_mark.line + 1 if problem_mark else None
    if context_mark is not None and (line is None or line > n_lines):
        line = context_mark.line + 1
        if context:
            problem += f" ({context} that starts here)"
    elif context_mark is not None and context and context_mark.line + 1 != line:
        problem += f" ({context} started at line {context_mark.line + 1})"
    if line is not None:
        line = min(line, n_lines)
    return ConfigIssue(shown, line, "", f"YAML syntax error: {problem}; fix the indentation or quoting there")


def _load_chain(path: Path, issues: list[ConfigIssue], seen: tuple = (), shown: str | None = None,
                at: tuple | None = None):
    """Load `path` and, recursively, the file its `base:` key names; merge base under it.

    A base path is relative to the folder of the file that names it."""
    from omegaconf import OmegaConf

    shown = shown or str(path)
    node, lines = _read_yaml(path, issues, shown, at)
    if node is None:
        return None, lines
    if "base" not in node:
        return node, lines
    base = OmegaConf.to_container(node, resolve=False)["base"]
    base_line = lines.get(("base",), (shown, None))[1]
    if not isinstance(base, str) or not base.strip():
        issues.append(ConfigIssue(shown, base_line, "base", f"got {base!r}; expected the path of a YAML file"))
        return None, lines
    base_shown = os.path.normpath(os.path.join(os.path.dirname(shown), os.path.expanduser(base)))
    base_path = (path.parent / os.path.expanduser(base)).resolve()
    if base_path.suffix not in (".yaml", ".yml") and base_path.is_file():
        # only another recipe or inventory: any other file's lines would be quoted in the errors
        issues.append(ConfigIssue(shown, base_line, "base", "expected the path of a recipe or inventory YAML file "
                                                            "(.yaml or .yml)"))
        return None, lines
    chain = seen + (path.resolve(),)
    if base_path in chain:
        names = [_short(p, shown) for p in chain] + [base_shown]
        issues.append(ConfigIssue(shown, base_line, "base", "circular base: " + " -> ".join(names)
                                  + "; a file cannot extend itself"))
        return None, lines
    base_node, base_lines = _load_chain(base_path, issues, chain, base_shown, (shown, base_line, "base"))
    if base_node is None:
        return None, lines
    del node["base"]
    node = OmegaConf.merge(base_node, node)
    lines = {**base_lines, **lines}
    lines.pop(("base",), None)
    return node, lines


def _short(p: Path, like: str) -> str:
    """`p` relative to the working directory when `like` (a shown path) is relative."""
    if os.path.isabs(like):
        return str(p)
    try:
        return os.path.relpath(p)
    except ValueError:
        return str(p)


def _first_line(e: BaseException) -> str:
    problem = getattr(e, "problem", None)  # PyYAML errors carry the short reason here
    if problem:
        return str(problem)
    text = str(e).strip()
    return text.splitlines()[0] if text else type(e).__name__


# --- overrides ------------------------------------------------------------------------------

def apply_overrides(node, overrides: list[str], lines: dict, issues: list[ConfigIssue]):
    """Apply `key=value` strings (omegaconf dot-list syntax, values parsed as YAML) on top of
    a document. The keys they set are reported at `<command line>`."""
    from omegaconf import OmegaConf

    for item in overrides:
        key, sep, value = item.partition("=")
        key = key.strip()
        if not sep or not key or not re.fullmatch(r"[A-Za-z_][\w\-]*(?:(?:\.[\w\-]+)|(?:\[\d+\]))*", key):
            issues.append(ConfigIssue(CLI, None, item, "expected key=value with a dotted key, "
                                                         "e.g. train.global_batch_size=512"))
            continue
        try:
            parsed = OmegaConf.to_container(OmegaConf.from_dotlist([f"_v={value}"]), resolve=False)["_v"]
        except Exception as e:
            issues.append(ConfigIssue(CLI, None, key, f"cannot parse the value {value!r}: {_first_line(e)}"))
            continue
        path = _key_path(key)
        was_mapping = [_is_mapping_at(node, path[:i]) for i in range(1, len(path) + 1)]
        try:
            OmegaConf.update(node, key, parsed, merge=True)
        except Exception as e:
            issues.append(ConfigIssue(CLI, None, key, f"cannot apply the override: {_first_line(e)}"))
            continue
        # The leaf and every level it created or replaced (a scalar turned into a mapping)
        # now come from the command line; below the leaf, a scalar value replaced everything.
        for i in range(1, len(path) + 1):
            prefix = path[:i]
            if i == len(path) or prefix not in lines or not was_mapping[i - 1]:
                lines[prefix] = (CLI, None)
        if not isinstance(parsed, (dict, list)):
            for k in [k for k in lines if len(k) > len(path) and k[:len(path)] == path]:
                del lines[k]
    return node


def _is_mapping_at(node, path: tuple) -> bool:
    """Whether `path` names a mapping or list (not a scalar, not absent) in `node`."""
    from omegaconf import OmegaConf

    cur = node
    for p in path:
        try:
            cur = cur._get_node(p) if OmegaConf.is_config(cur) else None
        except Exception:
            return False
        if cur is None:
            return False
    return OmegaConf.is_config(cur)


# --- interpolation ---------------------------------------------------------------------------

def _resolve(node, file: str, lines: dict, issues: list[ConfigIssue]) -> tuple[dict, set]:
    """Plain data with every `${...}` resolved, leaf by leaf so that each failure is reported
    at its own key. Returns (data, key paths that failed)."""
    from omegaconf import OmegaConf

    failed: set[tuple] = set()

    def fail(path, problem):
        failed.add(path)
        f, line = _where_in(lines, path, file)
        issues.append(ConfigIssue(f, line, _dotted(path), problem))

    def walk(cfg, path):
        from omegaconf import DictConfig, ListConfig
        from omegaconf.errors import MissingMandatoryValue

        is_dict = isinstance(cfg, DictConfig)
        out = {} if is_dict else []
        for k in (cfg.keys() if is_dict else range(len(cfg))):
            p = path + (k,)
            child = cfg._get_node(k)
            if path == () and k in DEFERRED_KEYS:
                out[k] = (OmegaConf.to_container(child, resolve=False) if OmegaConf.is_config(child)
                          else child._value())  # a scalar there: the schema says what is wrong
                continue
            if isinstance(child, (DictConfig, ListConfig)) and not OmegaConf.is_interpolation(cfg, k) \
                    and not OmegaConf.is_missing(cfg, k):
                value = walk(child, p)
            else:
                try:
                    value = cfg[k]
                    if OmegaConf.is_config(value):
                        value = OmegaConf.to_container(value, resolve=True)
                except MissingMandatoryValue:
                    fail(p, f"is {MISSING!r} (a value that must be given); set it here or on the command "
                            f"line: {_dotted(p)}=VALUE")
                    value = None
                except Exception as e:
                    raw = repr(OmegaConf.to_container(cfg, resolve=False)[k])
                    hint = ("; ${plan.*} is only known under launch: (it is filled in at submit time)"
                            if "${plan." in raw else "")
                    fail(p, f"cannot resolve interpolation {raw}: {_first_line(e)}{hint}")
                    value = None
            if is_dict:
                out[k] = value
            else:
                out.append(value)
        return out

    return walk(node, ()), failed


# --- validation ------------------------------------------------------------------------------

def _plain_document(path: Path, overrides, text: str | None = None) -> tuple[dict, dict] | None:
    """The parsed document when omegaconf would return it unchanged: no overrides, no
    `base:`, no `${...}` or `???` outside the deferred keys, no duplicate keys. Otherwise
    None (take the full path). `text`: the file as load() already read it."""
    import yaml

    if overrides:
        return None
    try:
        text = read_bounded(path) if text is None else text
        if _limit_issue(text, str(path)) is not None:
            return None
        data = yaml.safe_load(text)
    except (OSError, ValueError, yaml.YAMLError, RecursionError):  # UnicodeDecodeError is a ValueError
        return None  # the full path reports the problem with its line
    if not isinstance(data, dict) or "base" in data:
        return None
    if any("${" in s or s == MISSING for k, v in data.items() if k not in DEFERRED_KEYS for s in _strings(v)):
        return None
    if not all(isinstance(k, str) for k in data):
        return None
    dups: list[ConfigIssue] = []
    try:
        lines = _line_map(text, str(path), dups)
    except RecursionError:
        return None  # the full path reports it
    if dups:
        return None
    return data, lines


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


def load(path: str | Path, model_cls, overrides: list[str] | None = None, checks: tuple[Check, ...] = ()) -> Loaded:
    """Load, merge, override, resolve and validate one recipe or inventory file.

    `checks` are extra rules on the resolved data (e.g. "the model preset exists"), run even
    when the schema has errors, so that every problem is reported at once."""
    p = Path(path)
    shown = str(path)
    issues: list[ConfigIssue] = []
    failed: set = set()
    text = None
    if not overrides:

        try:
            text = read_bounded(p)
        except (OSError, ValueError):
            text = None  # the full path below reports it
        hit = validcache.get(_kind(model_cls), text) if text is not None else None
        if hit is not None:  # the same text validated before: no YAML, no pydantic
            value, data = hit
            return Loaded(shown, value, data, None, {})
    if isinstance(model_cls, str):  # named lazily so that a cache hit never imports pydantic
        from jobctl.config import schema

        model_cls = getattr(schema, model_cls)
    fast = _plain_document(p, overrides, text)  # the text read above: the file is read once
    if fast is not None:  # nothing for omegaconf to do: skip its import (start-up time)
        data, lines = fast
        node = None
    else:
        node, lines = _load_chain(p, issues, shown=shown)
        if node is None:
            raise ConfigError(_ordered(issues))
        node = apply_overrides(node, overrides or [], lines, issues)
        too_big = _interpolation_issues(node, shown, lines)
        if too_big:
            raise ConfigError(_ordered(issues + too_big))
        data, failed = _resolve(node, shown, lines, issues)
    value, more = _validation_issues(data, model_cls, shown, lines, failed)
    issues += more

    def where(loc):
        return _where_in(lines, loc, shown)

    failed_keys = {_dotted(f) for f in failed}
    for check in checks:
        issues += [i for i in check(data, where) if not any(i.key == k or i.key.startswith(k + ".") for k in failed_keys)]
    if issues:
        raise ConfigError(_ordered(issues))
    if fast is not None and text is not None:

        validcache.put(_kind(model_cls), text, value, data)
    return Loaded(shown, value, data, node, lines)


def _kind(model_cls) -> str:
    return model_cls if isinstance(model_cls, str) else model_cls.__name__


FRAMEWORK_ARGS = "${framework.args}"


def resolve_launch(recipe_data: dict, plan: dict, path: str = "<recipe>", framework: dict | None = None) -> dict:
    """Resolve the recipe's `launch` block now that the plan exists: `${plan.tp}`,
    `${train.seq_len}` and any other key of the recipe may be referred to, and the plan in the
    framework's own names (`framework`: {name, args, files}): `${framework.args}` (the
    arguments, shell-quoted inside a string command, spliced as separate words when it is a
    whole item of a list command), `${framework.files.KEY}` (a rendered file's path in the job),
    `${framework.name}`."""
    from omegaconf import OmegaConf

    launch = dict(recipe_data.get("launch") or {})
    context = {k: v for k, v in recipe_data.items() if k != "launch"}
    context["plan"] = dict(plan)
    fw = framework or {}
    last = [str(a) for a in fw.get("last") or []]
    args = [str(a) for a in fw.get("args") or []]
    if last and args[-len(last):] == last:  # they go at the very end of the command instead
        args = args[:-len(last)]
    words = {_SPLICES["args"]: args}
    words.update({_SPLICES[k]: [str(a) for a in fw.get(k) or []] for k in ("hf_args", "launch_args")})
    context["framework"] = {"name": fw.get("name", ""),
                            **{k: shlex.join(words[_SPLICES[k]]) for k in _SPLICES},
                            "files": {k.split(".")[0]: f"{JOB_FOLDER_TOKEN}/framework/{k}" for k in fw.get("files") or {}}}
    command = launch.get("command")
    splice = isinstance(command, list)
    if splice:  # a list item that is exactly ${framework.args} (or .hf_args, .launch_args) becomes those words
        launch["command"] = [_SPLICES.get(item[len("${framework."):-1], item)
                             if isinstance(item, str) and item.startswith("${framework.") and item.endswith("}")
                             else item for item in command]
    context["launch"] = launch
    try:
        node = OmegaConf.create(context)
        out = OmegaConf.to_container(node.launch, resolve=True)
    except Exception as e:
        msg = str(e).splitlines()[0]
        raise ConfigError([ConfigIssue(path, None, "launch", f"cannot resolve interpolation: {msg}; "
                                       "the plan's keys are " + ", ".join(sorted(plan)))]) from None
    uses_args = any(FRAMEWORK_ARGS in str(item) for item in (command if splice else [command or ""]))
    if splice:
        out["command"] = [w for item in out["command"] for w in words.get(item, [item])]
    if last and uses_args:
        out["command"] = out["command"] + last if splice else f"{out['command']} {shlex.join(last)}"
    return out


# a list item that is exactly ${framework.<key>} stands for these words (each its own argv item)
_SPLICES = {k: f"\x00jobctl-framework-{k}\x00" for k in ("args", "hf_args", "launch_args")}


def dump_yaml(data: dict) -> str:
    """Plain data as YAML text (the resolved recipe kept in a job folder)."""
    import yaml

    return yaml.safe_dump(data, sort_keys=False, default_flow_style=False, allow_unicode=True)


def from_data(data: dict, kind: str, path: str) -> Loaded:
    """A recipe or inventory (`kind`: "Recipe" or "Inventory") already resolved to plain data,
    as a job folder or a request keeps it (recipe.json, inventory.json), validated again:
    ConfigError naming `path` and the key when it no longer passes (another jobctl version)."""
    from pydantic import ValidationError

    from jobctl.config import schema

    if not isinstance(data, dict):
        raise ConfigError([ConfigIssue(path, None, "", f"expected a mapping, got {type(data).__name__}")])
    try:
        value = getattr(schema, kind).model_validate(data)
    except ValidationError as e:
        raise ConfigError([ConfigIssue(path, None, ".".join(str(x) for x in err["loc"]), err["msg"])
                           for err in e.errors()],
                          hint="was it written by another jobctl version? (`jobctl remote bootstrap CLUSTER` "
                               "installs this one on a login node)") from None
    return Loaded(path, value, data, None, {})


def parse_yaml_text(text: str):
    """YAML text jobctl itself wrote (a resolved recipe kept in the history), as plain data;
    None when it does not parse."""
    import yaml

    try:
        return yaml.load(text, Loader=getattr(yaml, "CSafeLoader", yaml.SafeLoader))
    except yaml.YAMLError:
        return None


def login_for_host(host: str):
    """A `login:` block with only a host (`jobctl clusters discover HOST`); UsageError when the
    host is not a bare host name or ssh alias."""
    from pydantic import ValidationError

    from jobctl.config.schema import Login

    try:
        return Login(host=host)
    except ValidationError as e:
        raise UsageError(f"HOST {host!r}: {e.errors()[0]['msg']}") from None


def inventory_from_text(text: str, path: str):
    """An inventory YAML text jobctl wrote (`clusters discover`), validated: a bug if not."""
    return from_data(parse_yaml_text(text), "Inventory", path)
