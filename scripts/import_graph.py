#!/usr/bin/env python3
"""Draw jobctl's package-level import graph (which package imports which) as Mermaid text,
and say whether it has a loop. `python scripts/import_graph.py > docs/import-graph.md`."""

from __future__ import annotations

import sys

import grimp

PACKAGES = ["cli", "ui", "jobs", "planning", "config", "planner", "frameworks", "runtime", "backends", "remote",
            "store", "model", "errors", "hooks"]


def main() -> int:
    graph = grimp.build_graph("jobctl", exclude_type_checking_imports=True)
    present = [p for p in PACKAGES if f"jobctl.{p}" in graph.modules]

    def package(module: str) -> str | None:
        parts = module.split(".")
        return parts[1] if len(parts) > 1 and parts[1] in present else None

    edges = set()
    for module in graph.modules:
        a = package(module)
        for imported in graph.find_modules_directly_imported_by(module):
            b = package(imported)
            if a and b and a != b:
                edges.add((a, b))
    loops = [(a, b) for a, b in edges if (b, a) in edges]
    print("# jobctl's import graph\n")
    print("Made by `python scripts/import_graph.py` from the code (grimp, the library behind import-linter):")
    print("an arrow `a --> b` means a module of `a` imports one of `b`, directly.\n")
    print("```mermaid\ngraph TD")
    for a, b in sorted(edges):
        print(f"  {a} --> {b}")
    print("```\n")
    print(f"Loops between packages: {', '.join(f'{a} <-> {b}' for a, b in loops) if loops else 'none'}.")
    up = [(a, b) for a, b in edges if a in ("runtime", "planner", "frameworks") and b in ("cli", "ui")]
    print(f"Imports from runtime, planner or frameworks into cli or ui: {up or 'none'}.")
    return 1 if loops or up else 0


if __name__ == "__main__":
    sys.exit(main())
