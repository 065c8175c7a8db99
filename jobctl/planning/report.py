"""A plan report: what `plan` says about a recipe on one inventory, as one typed value from
the planning service to the CLI, the submission and the recovery. `to_dict()` is the
`plan --json` contract (and plan.json in a job folder): the same keys, in the same order, as
tests/data/plan_snapshot.json.gz holds them.

Blocks that are themselves reports of the planner's objects (memory, estimate, the framework's
rendering, alternatives, ...) stay the plain data their own `to_dict()` gave: the report names
them, and a misspelt name is an AttributeError here, not a missing key in a user's JSON."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

# The keys every report has, in the JSON's order (one that fits, one that does not)...
_FIT_KEYS = ("recipe", "cluster", "partition", "gpu", "feasible", "objective", "model", "train", "plan",
             "framework", "memory", "estimate", "alternatives", "why_not", "search", "reasons", "suggestions")
_NO_FIT_KEYS = ("recipe", "cluster", "partition", "gpu", "feasible", "model", "plan", "memory", "closest",
                "search", "reasons", "suggestions")
# ... and the blocks added when there is something to say, in the order they come.
_OPTIONAL_KEYS = ("resilience", "learned", "explain", "objective_choice", "ladder", "history", "frameworks", "framework_advice",
                  "warnings")


@dataclass(slots=True)
class PlanReport:
    recipe: str
    cluster: str
    partition: str | None
    gpu: str | None
    feasible: bool
    model: dict | None = None
    plan: dict | None = None  # planner.plan.Plan.to_dict()
    memory: dict | None = None
    search: dict | None = None
    reasons: list[str] = field(default_factory=list)
    suggestions: list[str] = field(default_factory=list)
    # a plan that fits
    objective: str | None = None
    train: dict | None = None
    framework: dict | None = None  # the plan in its framework's own flags and files
    estimate: dict | None = None
    alternatives: list[dict] = field(default_factory=list)
    why_not: list[dict] = field(default_factory=list)
    # one that does not: the layout that came closest
    closest: dict | None = None
    # what the services add
    learned: dict | None = None  # the calibration an earlier OOM taught
    resilience: dict | None = None  # checkpoints and interruptions (planner/resilience.py)
    explain: dict | None = None  # --explain: the whole decision
    objective_choice: dict | None = None
    ladder: dict | None = None  # after an OOM: which rung, why, the calibration
    history: dict | None = None  # what the history says of this cluster
    frameworks: list[dict] | None = None  # every framework's row (--explain)
    framework_advice: list[str] | None = None
    warnings: list[str] | None = None  # the framework's release: the recipe's (or this machine's) vs jobctl's
    # the planner's own objects, for the services (never in the JSON)
    result: Any = field(default=None, repr=False, compare=False)  # planner.search.SearchResult
    workload: Any = field(default=None, repr=False, compare=False)  # planner.memory.Workload

    def to_dict(self) -> dict:
        """The JSON contract."""
        out = {k: getattr(self, k) for k in (_FIT_KEYS if self.feasible else _NO_FIT_KEYS)}
        out.update((k, getattr(self, k)) for k in _OPTIONAL_KEYS if getattr(self, k) is not None)
        return out
