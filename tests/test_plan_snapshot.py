"""Every shipped recipe on every shipped inventory plans as the stored copy says (tests/plan_snapshot.py).

The copy was written before the planner was made faster (issue 25) and holds the whole `plan
--json` output: the chosen plan, its memory term by term, its step estimate, the alternatives,
the "why not" lines, what the other objectives would pick and the framework comparison. Plans
and texts must be equal; numbers equal to 1e-9 (a sum taken in another order may differ in the
last bits).

What issue 25 moved behind --explain is compared on the same command run with --explain: every
framework's row (`frameworks`; the default view plans another framework only when it could be
1.2x faster, which is all its advice needs) and, for an objective other than the default, the
other objectives' picks that its notes do not read and the best tokens/s per GPU on the
partition (`objective_choice`)."""

from __future__ import annotations

import copy
import math

import pytest

import plan_snapshot

REL = 1e-9


def _diff(a, b, path="") -> str | None:
    """Where two JSON values differ, or None."""
    if isinstance(a, bool) or isinstance(b, bool) or a is None or b is None or isinstance(a, str):
        return None if a == b else f"{path}: {a!r} != {b!r}"
    if isinstance(a, (int, float)) and isinstance(b, (int, float)):
        return None if math.isclose(a, b, rel_tol=REL, abs_tol=1e-12) else f"{path}: {a!r} != {b!r}"
    if isinstance(a, dict) and isinstance(b, dict):
        if a.keys() != b.keys():
            return f"{path}: keys {sorted(a.keys() ^ b.keys())} differ"
        for k in a:
            d = _diff(a[k], b[k], f"{path}.{k}")
            if d:
                return d
        return None
    if isinstance(a, list) and isinstance(b, list):
        if len(a) != len(b):
            return f"{path}: {len(a)} items != {len(b)}"
        for i, (x, y) in enumerate(zip(a, b)):
            d = _diff(x, y, f"{path}[{i}]")
            if d:
                return d
        return None
    return f"{path}: {type(a).__name__} != {type(b).__name__}"


def default_view(stored: dict) -> dict:
    """The stored output as `plan` now prints it without --explain (see the module's docstring)."""
    out = copy.deepcopy(stored)
    if not isinstance(out, dict):
        return out
    out.pop("frameworks", None)
    choice = out.get("objective_choice")
    if choice and choice["name"] != "balanced":
        from jobctl.planner.explain import NOTED

        choice["others"] = {k: v for k, v in choice["others"].items() if k in NOTED[choice["name"]]}
        if "throughput" not in NOTED[choice["name"]] and choice["name"] != "throughput":
            choice["best_tokens_per_s_per_gpu"] = None
            for brief in [choice["chosen"], *choice["others"].values()]:
                if brief:
                    brief["efficiency"] = None
    return out


@pytest.fixture(scope="module")
def now():
    return plan_snapshot.collect()


@pytest.fixture(scope="module")
def explained():
    return plan_snapshot.collect(explain=True)


STORED = plan_snapshot.load()


def test_the_copy_covers_every_recipe_inventory_and_framework(now):
    assert sorted(now) == sorted(STORED)


@pytest.mark.parametrize("command", sorted(STORED))
def test_plan_is_unchanged(now, command):
    code, data = now[command]
    want_code, want = STORED[command]
    assert code == want_code
    d = _diff(data, default_view(want))
    assert d is None, d


@pytest.mark.parametrize("command", sorted(k for k in STORED if plan_snapshot.with_explain(k.split())))
def test_plan_with_explain_shows_all_it_showed_before(explained, command):
    code, data = explained[command]
    want_code, want = STORED[command]
    assert code == want_code
    if isinstance(data, dict):
        assert "explain" in data or not data.get("feasible")
        data = {k: v for k, v in data.items() if k != "explain"}
    d = _diff(data, want)
    assert d is None, d


def test_the_comparison_sees_a_changed_plan():
    """The comparison itself: a changed micro-batch, term or line is caught."""
    cmd = "plan recipes/llama70b.yaml --cluster h100 --json"
    want = STORED[cmd][1]
    for mutate in (lambda d: d["plan"].__setitem__("micro_batch_size", d["plan"]["micro_batch_size"] + 1),
                   lambda d: d["memory"]["terms"][0].__setitem__("bytes", d["memory"]["terms"][0]["bytes"] * 1.001),
                   lambda d: d["why_not"].append("x")):
        changed = copy.deepcopy(want)
        mutate(changed)
        assert _diff(changed, want) is not None
