"""The Plan: an immutable layout value, the same object for `plan --json` and `submit`."""

from __future__ import annotations

from dataclasses import MISSING, asdict, dataclass, fields
from typing import Any

from jobctl.errors import UsageError
from jobctl.model import StrEnum


class Sharding(StrEnum):
    """How data-parallel ranks share model states (ZeRO stages; zero3 = FSDP full shard; hsdp
    shards inside a group of ranks and replicates across groups)."""

    NONE = "none"
    ZERO1 = "zero1"
    ZERO2 = "zero2"
    ZERO3 = "zero3"
    HSDP = "hsdp"

    @property
    def zero_stage(self) -> int:
        """Its ZeRO stage: zero1 shards optimizer states, zero2 adds gradients, zero3 adds
        parameters (Rajbhandari et al. 2020, "ZeRO", §5); HSDP shards all three inside a group
        and replicates across groups, so within the group it is stage 3."""
        return {"none": 0, "zero1": 1, "zero2": 2, "zero3": 3, "hsdp": 3}[self.value]


class Recompute(StrEnum):
    NONE = "none"
    SELECTIVE = "selective"
    FULL = "full"


class Offload(StrEnum):
    NONE = "none"
    OPTIMIZER = "optimizer"
    OPTIMIZER_PARAMS = "optimizer+params"


class PlanError(UsageError):
    """A plan read back (plan.json, --after-oom) that is not a jobctl plan or does not add up."""


_CHOICES = {"sharding": Sharding, "recompute": Recompute, "offload": Offload}


@dataclass(frozen=True)
class Plan:
    """How a run is split: parallel dimensions, sharding, micro-batching and memory knobs.

    world_size = tp · pp · dp · cp = nodes · gpus_per_node, and
    global_batch_size = micro_batch_size · grad_accum_steps · dp.
    """

    nodes: int
    gpus_per_node: int
    tp: int
    pp: int
    dp: int
    cp: int
    sharding: str  # none | zero1 | zero2 | zero3 | hsdp
    micro_batch_size: int
    grad_accum_steps: int
    global_batch_size: int
    recompute: str  # none | selective | full
    offload: str  # none | optimizer | optimizer+params
    sequence_parallel: bool
    virtual_stages: int = 1
    hsdp_shard: int = 0  # ranks that shard the states together (hsdp); 0 = all dp·cp ranks
    recompute_layers: int = 0  # with recompute=full: layers per stage recomputed (0 = all)
    ep: int = 1  # expert parallelism (mixtures of experts): ranks of a stage that split the experts

    @property
    def expert_dp(self) -> int:
        """Ranks that hold the same experts (Megatron-Core's MoE parallel folding: a stage's
        tp·cp·dp ranks are ep groups of expert tensor parallelism 1, x expert data parallelism)."""
        return self.tp * self.cp * self.dp // self.ep

    @property
    def world_size(self) -> int:
        return self.nodes * self.gpus_per_node

    @property
    def shard_group(self) -> int:
        """Ranks over which ZeRO/FSDP shards model states (dp·cp, or the HSDP group)."""
        if self.sharding == "hsdp" and self.hsdp_shard:
            return self.hsdp_shard
        return self.dp * self.cp

    def to_dict(self) -> dict:
        d = asdict(self)
        d["world_size"] = self.world_size
        order = ["nodes", "gpus_per_node", "world_size"]
        return {k: d[k] for k in order} | {k: v for k, v in d.items() if k not in order}

    @classmethod
    def from_dict(cls, d: Any, source: str = "the plan") -> "Plan":
        """A Plan from its JSON form, validated: every field present with its type, the closed
        sets checked, the arithmetic checked (`check`). PlanError names `source` and the key.
        Keys it does not know (world_size, a newer jobctl's) are ignored."""
        if not isinstance(d, dict):
            raise PlanError(f"{source}: expected a JSON object with the plan's fields, got {type(d).__name__}")
        values, problems = {}, []
        for f in fields(cls):
            if f.name not in d:
                if f.default is MISSING:
                    problems.append(f"{f.name}: missing")
                continue
            v = d[f.name]
            if f.name in _CHOICES:
                allowed = [c.value for c in _CHOICES[f.name]]
                if v not in allowed:
                    problems.append(f"{f.name}: {v!r} is not one of {', '.join(allowed)}")
            elif f.name == "sequence_parallel":
                if not isinstance(v, bool):
                    problems.append(f"{f.name}: expected true or false, got {v!r}")
            elif not isinstance(v, int) or isinstance(v, bool) or v < (0 if f.name in ("hsdp_shard", "recompute_layers") else 1):
                problems.append(f"{f.name}: expected a positive integer, got {v!r}")
            values[f.name] = v
        if problems:
            raise PlanError(f"{source} is not a valid jobctl plan: " + "; ".join(problems),
                            hint="use the \"plan\" object of `jobctl plan RECIPE --cluster C --json`")
        plan = cls(**values)
        wrong = plan.check()
        if wrong:
            raise PlanError(f"{source} does not add up: " + "; ".join(wrong))
        return plan

    def check(self) -> list[str]:
        """Arithmetic problems with this plan, each showing the numbers."""
        problems = []
        product = self.tp * self.pp * self.dp * self.cp
        if product != self.world_size:
            problems.append(
                f"tp({self.tp}) * pp({self.pp}) * dp({self.dp}) * cp({self.cp}) = {product} "
                f"!= world_size({self.world_size}) = nodes({self.nodes}) * gpus_per_node({self.gpus_per_node})"
            )
        if (self.tp * self.cp * self.dp) % self.ep:
            problems.append(f"ep({self.ep}) does not divide a stage's ranks: tp({self.tp}) * cp({self.cp}) * "
                            f"dp({self.dp}) = {self.tp * self.cp * self.dp}")
        gbs = self.micro_batch_size * self.grad_accum_steps * self.dp
        if gbs != self.global_batch_size:
            problems.append(
                f"micro_batch_size({self.micro_batch_size}) * grad_accum_steps({self.grad_accum_steps}) "
                f"* dp({self.dp}) = {gbs} != global_batch_size({self.global_batch_size})"
            )
        return problems

    def layout_text(self) -> str:
        return layout_text(self.to_dict())

    def summary(self) -> str:
        rc = self.recompute + (f"({self.recompute_layers}/stage)" if self.recompute_layers else "")
        parts = [f"tp={self.tp}", f"pp={self.pp}", f"dp={self.dp}", f"cp={self.cp}", self.sharding,
                 f"mbs={self.micro_batch_size}x{self.grad_accum_steps}", f"recompute={rc}"]
        if self.virtual_stages > 1:
            parts.insert(2, f"v={self.virtual_stages}")
        if self.ep > 1:
            parts.insert(parts.index(f"cp={self.cp}") + 1, f"ep={self.ep}")
        if self.offload != "none":
            parts.append(f"offload={self.offload}")
        return " ".join(parts)


def layout_text(p: dict) -> str:
    """A plan (as its dict) in one short line: "tp2 pp4(v2) dp8 cp1 zero1 mbs2x16 rc=full"."""
    text = f"tp{p['tp']} pp{p['pp']}"
    if p.get("virtual_stages", 1) > 1:
        text += f"(v{p['virtual_stages']})"
    text += f" dp{p['dp']} cp{p['cp']}" + (f" ep{p['ep']}" if p.get("ep", 1) > 1 else "") + f" {p['sharding']} mbs{p['micro_batch_size']}x{p['grad_accum_steps']}"
    rc = p["recompute"]
    if rc != "none":
        text += f" rc={rc}" + (f"({p['recompute_layers']}/stage)" if p.get("recompute_layers") else "")
    if p["offload"] != "none":
        text += f" off={p['offload']}"
    return text
