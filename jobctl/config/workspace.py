"""Where recipes and inventories are found, and the embedded default inventory."""

from __future__ import annotations

import os
from pathlib import Path

from jobctl.errors import ConfigError, ConfigIssue, UsageError

REPO_ROOT = Path(__file__).resolve().parents[2]  # jobctl/config/workspace.py -> the checkout

# The embedded default: this machine, no scheduler, no GPU. Used when no `local`
# inventory file is found, so `jobctl submit recipes/tiny.yaml --cluster local` needs nothing.
EMBEDDED_LOCAL = {
    "name": "local",
    "scheduler": "local",
    "description": "this machine (embedded default): no scheduler, CPU only",
    "partitions": [{"name": "local", "gpu": "cpu", "gpus_per_node": 1, "nodes": 1, "cpus_per_node": 2, "mem_gib": 16}],
}


def cluster_dirs() -> list[Path]:
    """Folders searched for inventories, in order: $JOBCTL_CLUSTERS (os.pathsep-separated),
    ./clusters, and the clusters/ folder shipped next to the package."""
    out = [Path(p) for p in os.environ.get("JOBCTL_CLUSTERS", "").split(os.pathsep) if p]
    out += [Path.cwd() / "clusters", REPO_ROOT / "clusters"]
    seen, unique = set(), []
    for p in out:
        r = p.resolve()
        if r not in seen and r.is_dir():
            seen.add(r)
            unique.append(p)
    return unique


def find_cluster(name_or_path: str) -> Path | None:
    """An inventory path for `--cluster`: a file path, or a name looked up in cluster_dirs().
    None means the embedded `local` default."""
    p = Path(name_or_path).expanduser()
    if p.suffix in (".yaml", ".yml") or os.sep in name_or_path or (os.altsep and os.altsep in name_or_path):
        if not p.exists():
            names = all_cluster_names()
            named = f"; did you mean --cluster {p.stem}?" if p.stem in names else ""
            raise UsageError(f"inventory file not found: {name_or_path}{named}",
                             hint=f"give the path to a YAML inventory, or a cluster name ({', '.join(names)})")
        return p
    for d in cluster_dirs():
        for ext in (".yaml", ".yml"):
            cand = d / f"{name_or_path}{ext}"
            if cand.exists():
                return cand
    if name_or_path == "local":
        return None
    names = sorted(all_cluster_names())
    import difflib

    close = difflib.get_close_matches(name_or_path, names, n=1)
    raise UsageError(
        f"unknown cluster {name_or_path!r}" + (f"; did you mean {close[0]!r}?" if close else ""),
        hint=f"known clusters: {', '.join(names) or '(none)'}; or pass a path to an inventory file",
    )


def shadowing(name_or_path: str, kind: str = "cluster") -> str | None:
    """When a name (`--cluster dev`, a recipe name) is found in the current folder's clusters/
    or recipes/ while the shipped or configured ones hold one of the same name (or, for
    `local`, the embedded default), what to tell the user: a clone of someone's project must not
    quietly swap the inventory a command runs on."""
    p = Path(name_or_path)
    if p.suffix in (".yaml", ".yml") or os.sep in name_or_path or (os.altsep and os.altsep in name_or_path):
        return None  # a path says itself what it is
    here = (Path.cwd() / ("clusters" if kind == "cluster" else "recipes")).resolve()
    dirs = cluster_dirs() if kind == "cluster" else [d for d in recipe_dirs() if d.is_dir()]
    shipped = (REPO_ROOT / ("clusters" if kind == "cluster" else "recipes")).resolve()
    found = [d / f"{name_or_path}{ext}" for d in dirs for ext in (".yaml", ".yml") if (d / f"{name_or_path}{ext}").exists()]
    if not found or found[0].parent.resolve() != here or here == shipped:
        return None
    others = [f for f in found[1:] if f.parent.resolve() != here]
    if others:
        return f"{kind} {name_or_path!r}: using {found[0]} from this folder, not {others[0]}"
    if kind == "cluster" and name_or_path == "local":
        return f"cluster 'local': using {found[0]} from this folder, not the embedded default (this machine, CPU only)"
    return None


def all_cluster_files() -> list[Path]:
    seen, out = set(), []
    for d in cluster_dirs():
        for f in sorted(d.glob("*.y*ml")):
            if f.stem not in seen:
                seen.add(f.stem)
                out.append(f)
    return out


def all_cluster_names() -> list[str]:
    names = [f.stem for f in all_cluster_files()]
    return names if "local" in names else names + ["local"]


def recipe_dirs() -> list[Path]:
    return [Path.cwd() / "recipes", REPO_ROOT / "recipes"]


def find_recipe(name_or_path: str) -> Path:
    """A recipe path: a file, or a name looked up in ./recipes and the shipped recipes/.

    An unknown name (no folder, no .yaml) is a ConfigError with the close recipe names;
    a missing path is left to the loader, which reports it with the path."""
    p = Path(name_or_path).expanduser()
    if p.exists():
        return p
    if os.sep not in name_or_path and p.suffix not in (".yaml", ".yml"):
        for d in recipe_dirs():
            for ext in (".yaml", ".yml"):
                if (d / f"{name_or_path}{ext}").exists():
                    return d / f"{name_or_path}{ext}"
        import difflib

        names = sorted({f.stem for d in recipe_dirs() if d.is_dir() for f in d.glob("*.y*ml")})
        close = difflib.get_close_matches(name_or_path, names, n=1)
        raise ConfigError([ConfigIssue(name_or_path, None, "", "no such recipe file or name"
                                       + (f"; did you mean {close[0]!r}?" if close else "")
                                       + f" (recipes: {', '.join(names) or '(none)'}; or give a path to a YAML file)")])
    return p  # let the loader report "file not found" with the path
