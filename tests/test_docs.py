"""The docs stay behind the code (issue 27): what docs/generate.py makes from the code is what
the pages say, and every module, file, function and test the prose names exists.

When a generated region is stale, regenerate it (one command, from the repository root):

    python docs/generate.py

Everything else here fails on prose that names something the code no longer has: fix the prose.
"""

from __future__ import annotations

import ast
import importlib
import importlib.util
import re
from functools import cache
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
REGENERATE = "To fix: run `python docs/generate.py` from the repository root, then review the diff of docs/."
PAGES = sorted(ROOT.glob("docs/*.md")) + [ROOT / "README.md"]


def _load_generator():
    spec = importlib.util.spec_from_file_location("docs_generate", ROOT / "docs" / "generate.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


gen = _load_generator()
MODULES = gen.modules()  # dotted name -> source file, read from the tree as it is now
PACKAGES = {name.split(".")[1] for name in MODULES if name.count(".") == 1 and MODULES[name].name == "__init__.py"}
TOP_LEVEL = set(gen.top_level())


def prose(text: str) -> str:
    """A page without its generated regions: what a person wrote."""
    for _, start, end in reversed(gen.regions(text)):
        text = text[:start] + text[end:]
    return text


def _rel(page: Path) -> str:
    return page.relative_to(ROOT).as_posix()


# -- the generated regions ------------------------------------------------------------------

def test_generated_regions_match_the_code():
    problems = gen.stale()
    assert not problems, "\n\n".join(problems) + "\n\n" + REGENERATE


def test_the_import_graph_counts_imports_as_import_linter_does():
    """The generator reads the AST itself; grimp (import-linter's engine) must see the same
    package edges, or the page would say something `lint-imports` does not check."""
    grimp = pytest.importorskip("grimp")
    graph = grimp.build_graph("jobctl", exclude_type_checking_imports=True)
    theirs = set()
    for module in graph.modules:
        a = module.split(".")
        for imported in graph.find_modules_directly_imported_by(module):
            b = imported.split(".")
            if len(a) > 1 and len(b) > 1 and b[0] == "jobctl" and a[1] != b[1]:
                theirs.add((a[1], b[1]))
    ours = gen.package_edges()
    assert ours == theirs, (f"docs/generate.py counts imports differently from grimp: only it sees "
                            f"{sorted(ours - theirs)}, only grimp sees {sorted(theirs - ours)}; fix package_edges")
    assert set(MODULES) == set(graph.modules), sorted(set(MODULES) ^ set(graph.modules))


# -- names the prose uses -------------------------------------------------------------------

# `jobctl/...` (a file or a folder), `pkg/module.py` (pkg a package of jobctl), `tests/x.py`, ...
JOBCTL_PATH = re.compile(r"(?<![\w./~$-])jobctl/[\w./-]*[\w/]")
SHORT_PATH = re.compile(r"(?<![\w./~$-])((?:[\w-]+/)+[\w-]+\.py)\b")
# the repository's other folders of code (tests, benchmarks, scripts, jobctl_measure, ...)
REPO_DIRS = sorted(d.name for d in ROOT.iterdir() if d.is_dir() and d.name != "jobctl" and any(d.glob("*.py")))
REPO_PATH = re.compile(rf"(?<![\w./~$-])((?:{'|'.join(map(re.escape, REPO_DIRS))})/[\w./-]*\.(?:py|sh))\b")
TEST_FILE = re.compile(r"(?<![\w./-])((?:tests/)?(?:test_\w+|\.\.\.)(?:\.py)?)(::(\w+))?")
DOTTED = re.compile(r"(?<![\w./-])((?:jobctl\.)?[A-Za-z_]\w*(?:\.\w+)+(?::\w+)?)")
CODE_SPAN = re.compile(r"`([^`\n]+)`")
FILE_SUFFIXES = {"py", "md", "yaml", "yml", "json", "jsonl", "sh", "txt", "toml", "csv", "log", "pickle", "pkl",
                 "sqlite", "out", "err", "note", "html", "png"}


def _path_problem(path: str) -> str | None:
    """Why a path named in prose is not in the tree (None when it is, or is another project's)."""
    if path.startswith("jobctl/"):
        return None if (ROOT / path).exists() else f"{path} does not exist"
    parts = path.split("/")
    if parts[0] in REPO_DIRS:
        return None if (ROOT / path).exists() else f"{path} does not exist"
    if parts[0] in PACKAGES and (len(parts) == 2 or (ROOT / "jobctl" / Path(*parts[:-1])).is_dir()):
        # `runtime/zero/stage3.py` is DeepSpeed's: only folders jobctl has are jobctl's
        return None if (ROOT / "jobctl" / path).exists() else f"{path} (jobctl/{path}) does not exist"
    return None


@pytest.mark.parametrize("page", PAGES, ids=_rel)
def test_paths_named_in_the_docs_exist(page):
    text = prose(page.read_text(encoding="utf-8"))
    found = set(JOBCTL_PATH.findall(text)) | set(SHORT_PATH.findall(text)) | set(REPO_PATH.findall(text))
    problems = sorted(p for p in map(_path_problem, found) if p)
    assert not problems, f"{_rel(page)} names paths the code does not have:\n  " + "\n  ".join(problems)


@cache
def _test_names(path: Path) -> set[str]:
    tree = ast.parse(path.read_text(encoding="utf-8"))
    return {n.name for n in ast.walk(tree) if isinstance(n, (ast.FunctionDef, ast.ClassDef))}


@pytest.mark.parametrize("page", PAGES, ids=_rel)
def test_tests_named_in_the_docs_exist(page):
    """`test_x.py`, `tests/test_x.py::test_y`, and `...::test_z` (the last file on the line)."""
    problems = []
    for line in prose(page.read_text(encoding="utf-8")).splitlines():
        last = None
        for m in TEST_FILE.finditer(line):
            name, test = m[1], m[3]
            if name != "...":
                file = name.removeprefix("tests/")
                file = file if file.endswith(".py") else f"{file}.py"
                if not (name.endswith(".py") or test):
                    continue  # a bare word test_x is not a file
                last = ROOT / "tests" / file
                if not last.is_file():
                    problems.append(f"tests/{file} does not exist")
                    last = None
                    continue
            if test and last is not None and test not in _test_names(last):
                problems.append(f"{last.relative_to(ROOT)} has no {test}")
    assert not problems, f"{_rel(page)} names tests that do not exist:\n  " + "\n  ".join(sorted(set(problems)))


def _resolve(dotted: str) -> str | None:
    """Why `jobctl.a.b.Name`, `a.b:func` or `a.b.Name` (a a top-level name of jobctl) is not in
    the code; None when it is. The longest prefix that is a module must exist in the tree; the
    rest must be its attributes."""
    name = dotted.replace(":", ".")
    parts = name.split(".")
    if parts[0] != "jobctl":
        parts = ["jobctl", *parts]
    for i in range(len(parts), 1, -1):
        module = ".".join(parts[:i])
        if module in MODULES:
            break
    else:
        return f"{dotted}: no module {'.'.join(parts[:2])}"
    rest = parts[i:]
    if not rest or module == "jobctl.__main__":
        return None
    try:
        obj = importlib.import_module(module)
    except Exception as e:  # noqa: BLE001 (what failed is the message)
        return f"{dotted}: importing {module} failed: {type(e).__name__}: {e}"
    for attr in rest:
        if not hasattr(obj, attr):
            return f"{dotted}: {module} has no {'.'.join(rest[: rest.index(attr) + 1])}"
        obj = getattr(obj, attr)
    return None


def _resolve_in_module(module: str, name: str) -> str | None:
    """Why `name` is neither an attribute of `module` nor of a class defined there (prose names
    `SlurmBackend.cancel` as `cancel` after `backends/slurm.py`); None when it is one."""
    problem = _resolve(f"{module}.{name}")
    if problem is None or problem.startswith(f"{module}.{name}: importing"):
        return problem
    mod = importlib.import_module(module)
    classes = [c for c in vars(mod).values() if isinstance(c, type) and c.__module__ == module]
    return None if any(_has(c, name) for c in classes) else f"{module} (and its classes) has no {name}"


def _has(obj, dotted: str) -> bool:
    for attr in dotted.split("."):
        if not hasattr(obj, attr):
            return False
        obj = getattr(obj, attr)
    return True


def _dotted_names(text: str) -> set[str]:
    """`jobctl.x.y` anywhere, and `x.y.Name` / `x.y:func` in code spans where x is a top-level
    package or module of jobctl (not a file name such as `model.py`)."""
    found = {m for m in DOTTED.findall(text) if m.startswith("jobctl.")}
    for span in CODE_SPAN.findall(text):
        for m in DOTTED.findall(span):
            parts = m.replace(":", ".").split(".")
            if parts[0] in TOP_LEVEL and parts[-1] not in FILE_SUFFIXES:
                found.add(m)
    return {m for m in found if m.replace(":", ".").split(".")[-1] not in FILE_SUFFIXES}


@pytest.mark.parametrize("page", PAGES, ids=_rel)
def test_modules_named_in_the_docs_exist(page):
    names = _dotted_names(prose(page.read_text(encoding="utf-8")))
    problems = sorted(p for p in map(_resolve, names) if p)
    assert not problems, f"{_rel(page)} names modules or attributes the code does not have:\n  " + "\n  ".join(problems)


# `store/private.py` (`new_dir`, `write_new`): the names in parentheses are the module's
NAMED_IN_PATH = re.compile(r"`((?:jobctl/)?[\w/]+\.py)` \(((?:`[^`]+`(?:, )?)+)\)")


@pytest.mark.parametrize("page", PAGES, ids=_rel)
def test_functions_named_after_a_path_exist(page):
    problems = []
    for path, names in NAMED_IN_PATH.findall(prose(page.read_text(encoding="utf-8"))):
        dotted = path.removeprefix("jobctl/").removesuffix(".py").replace("/", ".")
        if dotted.split(".")[0] not in TOP_LEVEL or f"jobctl.{dotted}" not in MODULES:
            continue  # another project's file, or a path the path test already reports
        for name in re.findall(r"`([A-Za-z_][\w.]*)`", names):
            problem = _resolve_in_module(f"jobctl.{dotted}", name)
            if problem:
                problems.append(f"`{path}` (`{name}`): {problem}")
    assert not problems, f"{_rel(page)} names functions the code does not have:\n  " + "\n  ".join(problems)


# -- what each page must cover --------------------------------------------------------------

def test_every_top_level_package_is_in_the_architecture_page():
    text = prose((ROOT / "docs" / "architecture.md").read_text(encoding="utf-8"))
    missing = []
    for name in sorted(TOP_LEVEL):
        forms = [f"{name}/", f"jobctl.{name}"] if name in PACKAGES else [f"{name}.py", f"jobctl.{name}"]
        if not any(re.search(rf"(?<![\w.-]){re.escape(f)}(?![\w-])", text) for f in forms):
            missing.append(f"{name} (as {' or '.join(forms)})")
    assert not missing, ("docs/architecture.md (outside its generated regions) does not say what these parts of "
                         "jobctl are:\n  " + "\n  ".join(missing))


def _layout_modules() -> list[Path]:
    """The module(s) that know a job folder's layout: where `JobFolder` or `FRAMEWORK_DIR` is defined."""
    found = []
    for path in MODULES.values():
        tree = ast.parse(path.read_text(encoding="utf-8"))
        for node in tree.body:
            defines = (isinstance(node, ast.ClassDef) and node.name == "JobFolder") or (
                isinstance(node, ast.Assign) and any(isinstance(t, ast.Name) and t.id == "FRAMEWORK_DIR"
                                                     for t in node.targets))
            if defines:
                found.append(path)
                break
    return found


def _template(node: ast.JoinedStr) -> str | None:
    """`f"node-{int(node)}.log"` as a pattern `node-<...>\\.log` (None for a sentence)."""
    out, literal = [], ""
    for part in node.values:
        if isinstance(part, ast.Constant):
            literal += part.value
            out.append(re.escape(part.value))
        else:
            out.append(r"<[^>`]+>")
    if not literal.strip() or not re.fullmatch(r"[\w./-]+", literal):
        return None  # a message or a repr, not a name in the folder
    return "".join(out)


def layout_names() -> dict[str, str]:
    """What the layout code names, each as a pattern a code span of the page must match:
    its string constants (a name without a dot is a folder: `name/`), its file-name patterns
    (`re.compile(r"outcome-node(\\d+)\\.json")`) and the names it formats (`f"node-{n}.log"`)."""
    names = {}
    for path in _layout_modules():
        tree = ast.parse(path.read_text(encoding="utf-8"))
        for node in tree.body:
            if not isinstance(node, ast.Assign):
                continue
            for target in node.targets:
                pairs = []
                if isinstance(target, ast.Name):
                    pairs = [(target, node.value)]
                elif isinstance(target, ast.Tuple) and isinstance(node.value, ast.Tuple):
                    pairs = list(zip(target.elts, node.value.elts))
                for t, v in pairs:
                    if not (isinstance(t, ast.Name) and isinstance(v, ast.Constant) and isinstance(v.value, str)):
                        continue
                    if t.id.isupper():
                        value = v.value
                        names[f"{t.id} = {value!r}"] = (re.escape(value) + (r"(?![\w-])" if "." in value else "/"))
            call = node.value
            if (isinstance(call, ast.Call) and getattr(call.func, "attr", "") == "compile" and call.args
                    and isinstance(call.args[0], ast.Constant)):
                pattern = call.args[0].value
                names[f"re.compile({pattern!r})"] = re.sub(r"\([^)]*\)", r"<[^>`]+>", pattern)
        for node in ast.walk(tree):
            if isinstance(node, ast.JoinedStr) and (pattern := _template(node)):
                names[ast.unparse(node)] = pattern
    return names


def test_every_name_the_job_folder_layout_makes_is_in_job_folder_md():
    layout = _layout_modules()
    assert layout, "no module defines JobFolder or FRAMEWORK_DIR: update _layout_modules to the layout's new home"
    names = layout_names()
    assert len(names) >= 10, names
    spans = CODE_SPAN.findall(prose((ROOT / "docs" / "job-folder.md").read_text(encoding="utf-8")))
    missing = [f"{what} (pattern {pattern})" for what, pattern in sorted(names.items())
               if not any(re.search(rf"(?<![\w.-]){pattern}", span) for span in spans)]
    where = ", ".join(p.relative_to(ROOT).as_posix() for p in layout)
    assert not missing, (f"docs/job-folder.md does not name, in `code`, these parts of a job folder that {where} "
                         f"makes:\n  " + "\n  ".join(missing))


def test_every_exit_code_is_in_exit_codes_md():
    tree = ast.parse((ROOT / "jobctl" / "errors.py").read_text(encoding="utf-8"))
    codes = {t.id: n.value.value for n in tree.body if isinstance(n, ast.Assign) and isinstance(n.value, ast.Constant)
             for t in n.targets if isinstance(t, ast.Name) and t.id.startswith("EXIT_")}
    assert codes
    text = (ROOT / "docs" / "exit-codes.md").read_text(encoding="utf-8")
    missing = [f"{value} {name}" for name, value in codes.items()
               if not re.search(rf"^\| {value} \| `{name}` \|", text, re.MULTILINE)]
    assert not missing, "docs/exit-codes.md has no row `| CODE | `NAME` |` for:\n  " + "\n  ".join(missing)
