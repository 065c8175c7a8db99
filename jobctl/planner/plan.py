"""The Plan: an immutable layout value, the same object for `plan --json` and `submit`."""

from __future__ import annotations

from dataclasses import asdict, dataclass, fields


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
    def from_dict(cls, d: dict) -> "Plan":
        names = {f.name for f in fields(cls)}
        return cls(**{k: v for k, v in d.items() if k in names})

    def check(self) -> list[str]:
        """Arithmetic problems with this plan, each showing the numbers."""
        problems = []
        product = self.tp * self.pp * self.dp * self.cp
        if product != self.world_size:
            problems.append(
                f"tp({self.tp}) * pp({self.pp}) * dp({self.dp}) * cp({self.cp}) = {product} "
                f"!= world_size({self.world_size}) = nodes({self.nodes}) * gpus_per_node({self.gpus_per_node})"
            )
        gbs = self.micro_batch_size * self.grad_accum_steps * self.dp
        if gbs != self.global_batch_size:
            problems.append(
                f"micro_batch_size({self.micro_batch_size}) * grad_accum_steps({self.grad_accum_steps}) "
                f"* dp({self.dp}) = {gbs} != global_batch_size({self.global_batch_size})"
            )
        return problems

    def summary(self) -> str:
        rc = self.recompute + (f"({self.recompute_layers}/stage)" if self.recompute_layers else "")
        parts = [f"tp={self.tp}", f"pp={self.pp}", f"dp={self.dp}", f"cp={self.cp}", self.sharding,
                 f"mbs={self.micro_batch_size}x{self.grad_accum_steps}", f"recompute={rc}"]
        if self.virtual_stages > 1:
            parts.insert(2, f"v={self.virtual_stages}")
        if self.offload != "none":
            parts.append(f"offload={self.offload}")
        return " ".join(parts)
