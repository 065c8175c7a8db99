#!/usr/bin/env python3
"""Rewrite the generated regions of docs/*.md from the code, so those parts cannot drift.

    python docs/generate.py            # rewrite every region that differs from the code
    python docs/generate.py --check    # write nothing; list the regions that differ, exit 1 if any

A region is the text between `<!-- generated: NAME -->` and `<!-- end generated -->` in a
docs/*.md page; the prose around it is the author's and is never touched. The regions:

- `import-graph`: which top-level package of jobctl imports which, read from the AST of every
  module (imports inside functions count; those under `if TYPE_CHECKING:` do not, as
  import-linter counts them with `exclude_type_checking_imports = true`).
- `layers`: the layers contract of pyproject.toml, top to bottom, each package with the first
  paragraph of its docstring and its modules.

Standard library only, and nothing is imported from jobctl: it reads the source as text.
"""

from __future__ import annotations

import ast
import difflib
import re
import sys
from collections.abc import Callable
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PACKAGE = "jobctl"
BEGIN = re.compile(r"<!-- generated: ([\w-]+) -->\n")
END = "<!-- end generated -->"
COMMAND = "python docs/generate.py"
_DIFF_LINES = 30  # of a stale region's diff, shown by --check and the test


# -- the code, read as source ---------------------------------------------------------------

def modules(root: Path = ROOT) -> dict[str, Path]:
    """Every module of the package by dotted name (a package is its __init__.py). Folders
    without __init__.py are not packages (jobctl/runtime/_site), as for import-linter."""
    found: dict[str, Path] = {}

    def walk(folder: Path, name: str) -> None:
        found[name] = folder / "__init__.py"
        for child in sorted(folder.iterdir()):
            if child.is_dir() and (child / "__init__.py").is_file():
                walk(child, f"{name}.{child.name}")
            elif child.suffix == ".py" and child.name != "__init__.py":
                found[f"{name}.{child.stem}"] = child

    walk(root / PACKAGE, PACKAGE)
    return found


def top_level(root: Path = ROOT) -> list[str]:
    """The top-level packages and modules of jobctl (`cli`, `model`, `__main__`, ...)."""
    return sorted({name.split(".")[1] for name in modules(root) if name.count(".") >= 1})


def _is_type_checking(test: ast.expr) -> bool:
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING")


def imported_names(path: Path, module: str) -> set[str]:
    """The dotted names a module imports (absolute, relative ones resolved; for `from a import
    b`, both `a.b` and `a`), leaving out imports under `if TYPE_CHECKING:`."""
    is_package = path.name == "__init__.py"
    names: set[str] = set()

    class Visitor(ast.NodeVisitor):
        def visit_If(self, node: ast.If) -> None:
            if _is_type_checking(node.test):
                for child in node.orelse:
                    self.visit(child)
            else:
                self.generic_visit(node)

        def visit_Import(self, node: ast.Import) -> None:
            names.update(alias.name for alias in node.names)

        def visit_ImportFrom(self, node: ast.ImportFrom) -> None:
            if node.level:
                parts = module.split(".") if is_package else module.split(".")[:-1]
                parts = parts[: len(parts) - (node.level - 1)]
                base = ".".join(parts + ([node.module] if node.module else []))
            else:
                base = node.module or ""
            names.add(base)
            names.update(f"{base}.{alias.name}" for alias in node.names if alias.name != "*")

    Visitor().visit(ast.parse(path.read_text(encoding="utf-8"), str(path)))
    return names


def package_edges(root: Path = ROOT) -> set[tuple[str, str]]:
    """(a, b) for each top-level package or module `a` of jobctl that imports one of `b`."""
    mods = modules(root)
    edges = set()
    for name, path in mods.items():
        if name == PACKAGE:
            continue
        a = name.split(".")[1]
        for imported in imported_names(path, name):
            parts = imported.split(".")
            if len(parts) >= 2 and parts[0] == PACKAGE and f"{PACKAGE}.{parts[1]}" in mods and parts[1] != a:
                edges.add((a, parts[1]))
    return edges


def summary(path: Path) -> str:
    """A module's docstring's first paragraph, on one line ("" without a docstring)."""
    doc = ast.get_docstring(ast.parse(path.read_text(encoding="utf-8"))) or ""
    return " ".join(doc.strip().split("\n\n")[0].split())


def layer_entries(root: Path = ROOT) -> list[str]:
    """The layers contract of pyproject.toml as written, top to bottom (`"jobctl.a | jobctl.b"`)."""
    text = (root / "pyproject.toml").read_text(encoding="utf-8")
    try:
        import tomllib
    except ModuleNotFoundError:  # Python 3.10: the one list we need, read by hand
        block = re.search(r'type\s*=\s*"layers"\s*\nlayers\s*=\s*\[(.*?)\]', text, re.DOTALL)
        entries = re.findall(r'"([^"]+)"', block[1]) if block else None
    else:
        contracts = tomllib.loads(text).get("tool", {}).get("importlinter", {}).get("contracts", [])
        entries = next((c["layers"] for c in contracts if c.get("type") == "layers"), None)
    if entries is None:
        raise SystemExit("pyproject.toml: no layers contract under [tool.importlinter]")
    return entries


def layers(root: Path = ROOT) -> list[tuple[list[str], bool]]:
    """Each layer, top to bottom: its modules, and whether they may import each other (`a : b`)
    or not (`a | b`, import-linter's independent siblings)."""
    return [([m.strip() for m in re.split(r"[|:]", e)], ":" in e) for e in layer_entries(root)]


# -- the regions ----------------------------------------------------------------------------

def render_import_graph(root: Path = ROOT) -> str:
    edges = package_edges(root)
    names = top_level(root)
    linked = {n for edge in edges for n in edge}
    lines = ["```mermaid", "graph TD"]
    lines += [f"  {a} --> {b}" for a, b in sorted(edges)]
    lines += [f"  {n}" for n in names if n not in linked]
    lines.append("```")
    loops = sorted(f"{a} <-> {b}" for a, b in edges if (b, a) in edges and a < b)
    rank = {m.split(".", 1)[1]: (i, siblings) for i, (layer, siblings) in enumerate(layers(root)) for m in layer}
    upward = sorted(f"{a} --> {b}" for a, b in edges if a in rank and b in rank
                    and (rank[a][0] > rank[b][0] or (rank[a][0] == rank[b][0] and not rank[a][1])))
    lines.append("")
    lines.append(f"Loops between packages: {', '.join(loops) or 'none'}. "
                 f"Imports against the layers contract: {', '.join(upward) or 'none'}.")
    return "\n".join(lines) + "\n"


def _cell(text: str) -> str:
    return text.replace("|", "\\|") or "—"


def render_layers(root: Path = ROOT) -> str:
    mods = modules(root)
    listed = set()
    lines = ["| layer | package | what it is (its docstring) | its modules |", "|---|---|---|---|"]

    def row(layer: str, name: str) -> str:
        if name not in mods:
            return f"| {layer} | `{name}` | (not in the code) | — |"
        depth = name.count(".") + 1
        children = sorted(m.rsplit(".", 1)[1] for m in mods if m.startswith(f"{name}.") and m.count(".") == depth)
        return f"| {layer} | `{name}` | {_cell(summary(mods[name]))} | {_cell(', '.join(children))} |"

    for i, (layer, _) in enumerate(layers(root), 1):
        for name in layer:
            listed.add(name)
            lines.append(row(str(i), name))
    for name in top_level(root):
        if f"{PACKAGE}.{name}" not in listed:
            lines.append(row("none", f"{PACKAGE}.{name}"))
    return "\n".join(lines) + "\n"


GENERATORS: dict[str, Callable[[Path], str]] = {
    "import-graph": render_import_graph,
    "layers": render_layers,
}


def regions(text: str) -> list[tuple[str, int, int]]:
    """(name, start, end) of each generated region's body in a page."""
    found = []
    for m in BEGIN.finditer(text):
        end = text.find(END, m.end())
        following = BEGIN.search(text, m.end())
        if end < 0 or (following and following.start() < end):
            raise ValueError(f"<!-- generated: {m[1]} --> has no {END} before the next region or the end")
        found.append((m[1], m.end(), end))
    return found


def regenerate(text: str, root: Path = ROOT) -> tuple[str, dict[str, str]]:
    """The page with every region rewritten, and for each region that changed, a diff from
    what the page says to what the code gives."""
    changed = {}
    for name, start, end in reversed(regions(text)):
        if name not in GENERATORS:
            raise ValueError(f"unknown region {name!r} (known: {', '.join(GENERATORS)})")
        body = GENERATORS[name](root)
        if text[start:end] != body:
            diff = difflib.unified_diff(text[start:end].splitlines(), body.splitlines(), "the page", "the code",
                                        n=0, lineterm="")
            changed[name] = "\n".join(list(diff)[2:])
            text = text[:start] + body + text[end:]
    return text, dict(reversed(changed.items()))


def pages(root: Path = ROOT) -> list[Path]:
    return sorted((root / "docs").glob("*.md"))


def stale(root: Path = ROOT) -> list[str]:
    """What differs from the code now: one entry per stale region, with its diff (nothing is written)."""
    problems, seen = [], set()
    for page in pages(root):
        text = page.read_text(encoding="utf-8")
        seen.update(name for name, _, _ in regions(text))
        _, changed = regenerate(text, root)
        problems += [f"{page.relative_to(root)}: the generated region {name!r} differs from the code:\n"
                     + "\n".join(diff.splitlines()[:_DIFF_LINES]) for name, diff in changed.items()]
    problems += [f"docs/: no page holds the region {name!r}: put `<!-- generated: {name} -->` and `{END}` "
                 f"on lines of their own where it belongs" for name in GENERATORS if name not in seen]
    return problems


def main(argv: list[str]) -> int:
    check = "--check" in argv
    if set(argv) - {"--check"}:
        print(__doc__, file=sys.stderr)
        return 2
    if check:
        problems = stale()
        for p in problems:
            print(p, file=sys.stderr)
        if problems:
            print(f"To fix: {COMMAND}", file=sys.stderr)
        return 1 if problems else 0
    for page in pages():
        text = page.read_text(encoding="utf-8")
        new, changed = regenerate(text)
        if changed:
            page.write_text(new, encoding="utf-8")
            print(f"{page.relative_to(ROOT)}: rewrote {', '.join(changed)}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
