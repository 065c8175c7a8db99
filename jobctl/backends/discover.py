"""Discover a Slurm cluster's partitions and write an inventory; compare an inventory with the cluster.

Pure functions only (no subprocess, no SSH): the CLI (jobctl/cli/clusters.py) runs the commands

    sinfo -h -o '%P|%a|%l|%D|%c|%m|%G|%N'
    scontrol show partition -o
    scontrol show node -o

and hands their text here. `scontrol show node -o` is the main source (one line per node:
CPUTot, RealMemory, Gres, State, Partitions); `scontrol show partition -o` gives MaxTime and the
partitions without nodes; `sinfo` gives the default partition and is the fallback when scontrol
shows no nodes.
"""

from __future__ import annotations

import json
import re
from collections import Counter
from dataclasses import dataclass, field

from jobctl.backends.launch import parse_slurm_time
from jobctl.errors import EXIT_BACKEND, JobctlError

SINFO_FORMAT = "%P|%a|%l|%D|%c|%m|%G|%N"  # the columns parse_sinfo reads (slurm.py runs sinfo)

UNTYPED = "gpu"  # the --gpu-map key for untyped GRES (`gpu:8`)

# Slurm GRES type (lower case) -> catalog key(s). One key: certain; several: ask the user.
GRES_TYPES: dict[str, tuple[str, ...]] = {
    "h100": ("h100-sxm-80gb",),  # nearly every 8-GPU H100 node is SXM; PCIe nodes say h100_pcie
    "h100_sxm": ("h100-sxm-80gb",), "h100-sxm": ("h100-sxm-80gb",), "h100_80gb_hbm3": ("h100-sxm-80gb",),
    "h100_pcie": ("h100-pcie-80gb",), "h100-pcie": ("h100-pcie-80gb",),
    "h200": ("h200-141gb",), "h200_141gb": ("h200-141gb",),
    "a100": ("a100-sxm-80gb", "a100-sxm-40gb"),
    "a100_80gb": ("a100-sxm-80gb",), "a100-80gb": ("a100-sxm-80gb",), "a100_sxm4_80gb": ("a100-sxm-80gb",),
    "a100_40gb": ("a100-sxm-40gb",), "a100-40gb": ("a100-sxm-40gb",), "a100_sxm4_40gb": ("a100-sxm-40gb",),
    "a10g": ("a10g-24gb",),
    "l40s": ("l40s-48gb",),
    "v100": ("v100-32gb",), "v100_32gb": ("v100-32gb",), "v100-32gb": ("v100-32gb",),
    "rtx4090": ("rtx4090-24gb",), "4090": ("rtx4090-24gb",), "rtx_4090": ("rtx4090-24gb",),
    "mi300x": ("mi300x-192gb",), "mi300": ("mi300x-192gb",),
    "b200": ("b200-192gb",),
}


# --- parsing -----------------------------------------------------------------------------------


@dataclass(frozen=True)
class SinfoRow:
    partition: str
    default: bool
    avail: str
    time_limit: str
    nodes: int
    cpus: int | None
    memory_mb: int | None
    gres: str
    nodelist: str


MAX_GPUS_PER_NODE = 64  # the inventory schema's limit (config/schema.py, Partition.gpus_per_node)


def _int(text: str | None) -> int | None:
    m = re.match(r"\d+", (text or "").strip())
    return int(m.group()) if m else None


def parse_sinfo(text: str) -> list[SinfoRow]:
    """Rows of `sinfo -h -o '%P|%a|%l|%D|%c|%m|%G|%N'` (`%c` may be `16+`, `%m` `64000+`)."""
    rows = []
    for line in text.splitlines():
        if not line.strip():
            continue
        f = line.strip().split("|")
        if len(f) < 8:
            raise ValueError(f"unexpected sinfo line (want 8 fields separated by |): {line!r}")
        name = f[0]
        rows.append(SinfoRow(name.rstrip("*"), name.endswith("*"), f[1], f[2], _int(f[3]) or 0, _int(f[4]),
                             _int(f[5]), f[6], "|".join(f[7:])))
    return rows


_KEY = re.compile(r"^([A-Za-z][A-Za-z0-9_/:.]*)=(.*)$")


def parse_kv_line(line: str) -> dict[str, str]:
    """One `scontrol show ... -o` line as a dict; a word without `Key=` continues the previous value
    (e.g. `OS=Linux 6.1 #1 SMP`, `Reason=disk failed [root@2026-01-01]`)."""
    out: dict[str, str] = {}
    last = None
    for word in line.split():
        m = _KEY.match(word)
        if m:
            last = m.group(1)
            out[last] = m.group(2)
        elif last is not None:
            out[last] = f"{out[last]} {word}"
    return out


def parse_scontrol(text: str) -> list[dict[str, str]]:
    """Every non-empty line of `scontrol show partition -o` / `scontrol show node -o`."""
    return [parse_kv_line(line) for line in text.splitlines() if "=" in line]


def parse_cluster_name(text: str) -> str | None:
    """ClusterName from `scontrol show config`."""
    m = re.search(r"^\s*ClusterName\s*=\s*(\S+)", text, re.MULTILINE)
    return m.group(1) if m else None


@dataclass(frozen=True)
class Gres:
    name: str
    type: str | None
    count: int


def parse_gres(text: str | None) -> list[Gres]:
    """`gpu:h100:8`, `gpu:8`, `gpu:a100:4(S:0-1)`, `gpu:h100:4,gpu:a100:2`, `(null)` -> entries."""
    out = []
    text = re.sub(r"\([^)]*\)", "", text or "")  # socket/index specs: (S:0-1), (IDX:0-3)
    for item in text.split(","):
        item = item.strip()
        if not item or item in ("null", "N/A"):
            continue
        parts = item.split(":")
        count = 1
        if len(parts) > 1 and re.fullmatch(r"-?\d+[KMG]?", parts[-1]):
            count = _count(parts.pop())  # a negative count is kept: cluster_facts refuses it
        out.append(Gres(parts[0], parts[1] if len(parts) > 1 and parts[1] else None, count))
    return out


def _count(text: str) -> int:
    mult = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}.get(text[-1], 1)
    return int(text.rstrip("KMG")[:12]) * mult  # 12 digits: more is no count, and int() stays cheap


def gpus_of(gres: str | None) -> tuple[str | None, int]:
    """(GRES type or None for untyped, GPU count) of a node's Gres; (None, 0) without GPUs.
    Several GPU types on one node: the most numerous one."""
    gpus = [g for g in parse_gres(gres) if g.name == "gpu"]
    if not gpus:
        return None, 0
    best = max(gpus, key=lambda g: g.count)
    return best.type, sum(g.count for g in gpus if g.type == best.type)


def node_state(state: str | None) -> str:
    """'up', 'drained' (DRAIN, DRAINING, DRAINED) or 'down' (DOWN, FAIL, NOT_RESPONDING `*` ...)."""
    s = (state or "").upper()
    words = set(re.split(r"[+]", s.rstrip("*~#!%$@^-")))
    if any(w.startswith("DRAIN") for w in words):
        return "drained"
    if s.endswith("*") or words & {"DOWN", "FAIL", "FAILING", "NOT_RESPONDING", "UNKNOWN", "INVAL", "FUTURE",
                                   "POWERED_DOWN", "POWER_DOWN", "REBOOT_ISSUED"}:
        return "down"
    return "up"


def mib_to_gib(mb: int | None) -> int | None:
    """Slurm's RealMemory (MiB, which Slurm calls MB) in whole GiB, rounded down."""
    return None if mb is None else mb // 1024


def time_limit(value: str | None) -> str | None:
    """Slurm MaxTime / sinfo %l as an inventory time_limit; None for UNLIMITED/infinite/NONE."""
    v = (value or "").strip()
    if not v or v.upper() in ("UNLIMITED", "INFINITE", "NONE", "N/A"):
        return None
    return v


# --- the cluster as discovered -----------------------------------------------------------------


@dataclass
class PartitionFacts:
    """What the cluster says about one partition (the most common node shape in it)."""

    name: str
    gres_type: str | None  # None: untyped GRES (or no GPUs)
    gpus_per_node: int
    nodes: int  # all nodes in the partition
    cpus_per_node: int | None
    mem_gib: int | None
    time_limit: str | None
    raw_time_limit: str = ""
    default: bool = False
    drained: list[str] = field(default_factory=list)
    down: list[str] = field(default_factory=list)
    other_shapes: int = 0  # nodes whose shape differs from the one reported
    source: str = "scontrol show node"
    block_nodes: int = 0  # nodes per Slurm topology block holding its nodes (0: no block topology)

    @property
    def has_gpus(self) -> bool:
        return self.gpus_per_node > 0

    @property
    def gres_label(self) -> str:
        return f"gpu:{self.gres_type}:{self.gpus_per_node}" if self.gres_type else f"gpu:{self.gpus_per_node}"


def cluster_facts(sinfo_text: str, partition_text: str, node_text: str,
                  topology_text: str = "") -> list[PartitionFacts]:
    """Partitions with their nodes' shape, from the commands' outputs (any may be empty);
    `topology_text`: `scontrol show topology` under topology/block (block sizes)."""
    facts = _cluster_facts(sinfo_text, partition_text, node_text)
    try:
        blocks = block_sizes(topology_text)
    except DiscoveryError:
        blocks = {}  # an unreadable topology leaves the domains at one node, as without one
    if blocks:
        members: dict[str, list[str]] = {}
        for n in parse_scontrol(node_text):
            for p in (n.get("Partitions") or "").split(","):
                members.setdefault(p, []).append(n.get("NodeName", ""))
        for f in facts:
            sizes = [blocks.get(node) for node in members.get(f.name, [])]
            if sizes and all(sizes):
                f.block_nodes = min(sizes)  # the domain every job of the partition can count on
    return facts


def _cluster_facts(sinfo_text: str, partition_text: str, node_text: str) -> list[PartitionFacts]:
    sinfo = parse_sinfo(sinfo_text)
    parts = parse_scontrol(partition_text)
    nodes = parse_scontrol(node_text)
    order: list[str] = []
    for name in [p.get("PartitionName", "") for p in parts] + [r.partition for r in sinfo]:
        if name and name not in order:
            order.append(name)
    max_time = {p["PartitionName"]: p.get("MaxTime", "") for p in parts if "PartitionName" in p}
    default = {p["PartitionName"] for p in parts if p.get("Default", "").upper() == "YES"}
    default |= {r.partition for r in sinfo if r.default}
    by_part: dict[str, list[dict]] = {}
    for n in nodes:
        for p in (n.get("Partitions") or "").split(","):
            if p:
                by_part.setdefault(p, []).append(n)
                if p not in order:
                    order.append(p)
    facts = []

    def counted(name: str, gres: str | None) -> tuple[str | None, int]:
        gtype, count = gpus_of(gres)
        if not 0 <= count <= MAX_GPUS_PER_NODE:
            raise DiscoveryError(
                f"partition {name!r}: its nodes' Gres={gres!r} gives {count} GPUs per node, which no node has "
                f"(jobctl plans for 1 to {MAX_GPUS_PER_NODE})",
                hint="fix the node's Gres in slurm.conf / gres.conf (`scontrol show node`), or write the inventory "
                     "by hand for that partition")
        return gtype, count

    for name in order:
        members = by_part.get(name, [])
        raw_time = max_time.get(name) or next((r.time_limit for r in sinfo if r.partition == name), "")
        if members:
            shapes = Counter()
            for n in members:
                gtype, count = counted(name, n.get("Gres"))
                shapes[(gtype, count, _int(n.get("CPUTot")), mib_to_gib(_int(n.get("RealMemory"))))] += 1
            (gtype, count, cpus, mem), most = max(shapes.items(), key=lambda kv: (kv[1], kv[0][1]))
            states = [(n.get("NodeName", "?"), node_state(n.get("State"))) for n in members]
            facts.append(PartitionFacts(
                name, gtype, count, len(members), cpus, mem, time_limit(raw_time), raw_time, name in default,
                [n for n, s in states if s == "drained"], [n for n, s in states if s == "down"],
                len(members) - most))
            continue
        rows = [r for r in sinfo if r.partition == name]
        if not rows or not sum(r.nodes for r in rows):
            facts.append(PartitionFacts(name, None, 0, 0, None, None, time_limit(raw_time), raw_time,
                                        name in default, source="scontrol show partition (no nodes)"))
            continue
        r = max(rows, key=lambda r: r.nodes)
        gtype, count = counted(name, r.gres)
        facts.append(PartitionFacts(name, gtype, count, sum(x.nodes for x in rows), r.cpus, mib_to_gib(r.memory_mb),
                                    time_limit(raw_time), raw_time, name in default,
                                    other_shapes=sum(x.nodes for x in rows) - r.nodes, source="sinfo"))
    return facts


# --- block topology (Slurm's topology/block: one block per NVLink domain, e.g. a GB200 NVL72 rack)

MAX_HOSTS = 1 << 17  # the inventory schema's node limit


def expand_hostlist(expr: str, limit: int = MAX_HOSTS) -> list[str]:
    """Slurm's hostlist syntax ("gb[001-018,020],login1") as names; more than `limit` names, a
    bracket left open or a range backwards is a DiscoveryError (scheduler output is input)."""
    out: list[str] = []
    for item in split_hostlist(expr):
        out += _expand_item(item, limit - len(out))
    return out


def split_hostlist(expr: str) -> list[str]:
    """A host list's items, split at the commas outside brackets ("a,b[1-3,7]" -> a, b[1-3,7])."""
    depth, start = 0, 0
    items = []
    for i, ch in enumerate(expr + ","):
        if ch == "[":
            depth += 1
        elif ch == "]":
            depth -= 1
        elif ch == "," and depth == 0:
            items.append(expr[start:i])
            start = i + 1
        if depth not in (0, 1):
            raise DiscoveryError(f"cannot read the host list {expr[:200]!r}: nested brackets")
    if depth:
        raise DiscoveryError(f"cannot read the host list {expr[:200]!r}: a bracket is not closed")
    return [x.strip() for x in items if x.strip()]


def _expand_item(item: str, room: int) -> list[str]:
    if "[" not in item:
        return [item]
    head, rest = item.split("[", 1)
    ranges, tail = rest.split("]", 1)
    names = []
    for part in ranges.split(","):
        lo, _, hi = part.partition("-")
        if not lo.isdigit() or (hi and not hi.isdigit()) or int(hi or lo) < int(lo):
            raise DiscoveryError(f"cannot read the host range {part[:50]!r} in {item[:200]!r}")
        if int(hi or lo) - int(lo) + 1 + len(names) > room:
            raise DiscoveryError(f"the host list {item[:200]!r} names more than {MAX_HOSTS} nodes")
        names += [f"{head}{k:0{len(lo)}d}" for k in range(int(lo), int(hi or lo) + 1)]
    return [n + t for n in names for t in (_expand_item(tail, room) if "[" in tail else [tail])][:room]


def block_sizes(text: str) -> dict[str, int]:
    """Node name -> nodes in its block, from `scontrol show topology` under topology/block, whose
    records are "BlockName=b1 BlockIndex=0 Nodes=gb[01-18]" (slurm src/plugins/topology/block
    _print_topo_record). Other topologies (SwitchName= records) give {}."""
    out: dict[str, int] = {}
    for line in text.splitlines():
        fields = dict(w.split("=", 1) for w in line.split() if "=" in w)
        if "BlockName" in fields and fields.get("Nodes"):
            nodes = expand_hostlist(fields["Nodes"])
            for n in nodes:
                out[n] = len(nodes)
    return out


# --- GPU types ---------------------------------------------------------------------------------


class DiscoveryError(JobctlError):
    """What sinfo/scontrol answered cannot describe a cluster jobctl can plan for (exit 5)."""

    exit_code = EXIT_BACKEND


class AmbiguousGPU(Exception):
    """GRES types that do not name one catalog entry: {gres key: (choices, partitions)}."""

    def __init__(self, questions: dict[str, tuple[tuple[str, ...], list[str]]]):
        self.questions = questions
        super().__init__(self.message())

    def message(self) -> str:
        parts = []
        for key, (choices, partitions) in self.questions.items():
            what = "untyped GRES `gpu:N`" if key == UNTYPED else f"GRES type {key!r}"
            parts.append(f"{what} (partition {', '.join(partitions)}) could be "
                         + " or ".join(choices) + "; pass " + " or ".join(f"--gpu-map {key}={c}" for c in choices[:3])
                         + (" ..." if len(choices) > 3 else ""))
        return "; ".join(parts)


def gpu_choices(gres_type: str | None, catalog_keys: list[str]) -> tuple[str, ...]:
    """Catalog keys a GRES type may mean: one when certain, several when ambiguous, () when unknown."""
    if gres_type is None:
        return tuple(k for k in catalog_keys if k != "cpu")
    t = gres_type.lower()
    if t in catalog_keys:
        return (t,)
    if t in GRES_TYPES:
        return GRES_TYPES[t]
    return tuple(k for k in catalog_keys if k != "cpu" and k.startswith(t.replace("_", "-")))


def resolve_gpus(facts: list[PartitionFacts], gpu_map: dict[str, str], catalog_keys: list[str]) -> dict[str, str]:
    """{partition: catalog key}; raises AmbiguousGPU listing every question at once."""
    out: dict[str, str] = {}
    questions: dict[str, tuple[tuple[str, ...], list[str]]] = {}
    for f in facts:
        if not f.has_gpus:
            if f.nodes:
                out[f.name] = "cpu"
            continue
        key = f.gres_type or UNTYPED
        mapped = gpu_map.get(key) or gpu_map.get(key.lower())
        if mapped:
            out[f.name] = mapped
            continue
        choices = gpu_choices(f.gres_type, catalog_keys)
        if len(choices) == 1:
            out[f.name] = choices[0]
        else:
            questions.setdefault(key, (choices or tuple(k for k in catalog_keys if k != "cpu"), []))[1].append(f.name)
    if questions:
        raise AmbiguousGPU(questions)
    return out


# --- writing the inventory ---------------------------------------------------------------------


# Words a YAML 1.1 reader takes for booleans or null rather than strings.
_YAML_WORDS = {"y", "yes", "n", "no", "true", "false", "on", "off", "null", "~"}


def _scalar(value) -> str:
    """A value for the inventory's YAML: plain when it cannot be read as anything but this
    string (a name starting with a letter, no YAML word), else a JSON string (valid YAML)."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (int, float)):
        return str(value)
    s = str(value)
    plain = re.fullmatch(r"[A-Za-z][A-Za-z0-9_./@+-]*", s) and s.lower() not in _YAML_WORDS
    return s if plain else json.dumps(s)


def inventory_yaml(name: str, facts: list[PartitionFacts], gpus: dict[str, str], *, source: str,
                   login: dict | None = None) -> str:
    """The inventory as YAML text, with comments saying where every value came from."""
    lines = [f"# Discovered by `jobctl clusters discover` from {source}:",
             f"#   sinfo -h -o '{SINFO_FORMAT}', scontrol show partition -o, scontrol show node -o",
             "# Check it with `jobctl clusters check NAME`; link bandwidths come from the GPU catalog.",
             f"name: {_scalar(name)}", "scheduler: slurm", "partitions:"]
    skipped = []
    for f in facts:
        if f.name not in gpus or not f.nodes:
            skipped.append(f.name)
            continue
        gres = f.gres_label if f.has_gpus else "no GPU GRES"
        lines.append(f"  - name: {_scalar(f.name)}" + ("  # the default partition" if f.default else ""))
        lines.append(f"    gpu: {_scalar(gpus[f.name])}  # Gres={gres}")
        if f.has_gpus:
            lines.append(f"    gpus_per_node: {f.gpus_per_node}  # Gres={gres}")
        else:
            lines.append("    gpus_per_node: 1  # CPU partition: one `cpu` device per node")
        note = []
        if f.drained:
            note.append(f"drained now: {','.join(f.drained)}")
        if f.down:
            note.append(f"down now: {','.join(f.down)}")
        if f.other_shapes:
            note.append(f"{f.other_shapes} node(s) have another shape; values below are the most common one")
        lines.append(f"    nodes: {f.nodes}  # nodes in the partition ({f.source})" + (f"; {'; '.join(note)}" if note else ""))
        if f.cpus_per_node:
            lines.append(f"    cpus_per_node: {f.cpus_per_node}  # CPUTot")
        mem = f.mem_gib if f.mem_gib else 1
        lines.append(f"    mem_gib: {mem}  # RealMemory MB / 1024, rounded down" if f.mem_gib else
                     "    mem_gib: 1  # RealMemory unknown: set it")
        if f.block_nodes > 1 and f.has_gpus:
            lines.append(f"    nvlink_domain_gpus: {f.block_nodes * f.gpus_per_node}  # Slurm topology/block: "
                         f"{f.block_nodes} nodes per block, taken as one NVLink domain (check it)")
        if f.time_limit:
            lines.append(f"    time_limit: {_scalar(f.time_limit)}  # MaxTime")
        else:
            lines.append(f"    # time_limit: none (MaxTime={f.raw_time_limit or 'unknown'})")
    if skipped:
        lines.append(f"# skipped (no nodes): {', '.join(skipped)}")
    if login:
        lines.append("login:  # where this was discovered from")
        for k, v in login.items():
            lines.append(f"  {k}: {_scalar(v)}")
    return "\n".join(lines) + "\n"


# --- drift -------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Drift:
    partition: str
    what: str
    inventory: str
    cluster: str
    status: str  # ok / changed / missing / extra

    def as_dict(self) -> dict:
        return {"partition": self.partition, "what": self.what, "inventory": self.inventory,
                "cluster": self.cluster, "status": self.status}


def compare(inventory, facts: list[PartitionFacts], catalog_keys: list[str]) -> list[Drift]:
    """Rows comparing an Inventory (schema.Inventory) with the cluster's facts, one per value."""
    rows: list[Drift] = []
    by_name = {f.name: f for f in facts}
    for p in inventory.partitions:
        f = by_name.get(p.name)
        if f is None or not f.nodes:
            rows.append(Drift(p.name, "partition", "present", "absent" if f is None else "no nodes", "missing"))
            continue
        rows.append(Drift(p.name, "partition", "present", "present", "ok"))
        if f.has_gpus:
            choices = gpu_choices(f.gres_type, catalog_keys)
            gpu_ok = (p.gpu in choices or not choices
                      or (f.gres_type is not None and p.gpu.startswith(f.gres_type.lower().replace("_", "-"))))
        else:
            gpu_ok = p.gpu == "cpu"
        rows.append(Drift(p.name, "gpu", p.gpu, f.gres_label if f.has_gpus else "no GPUs", "ok" if gpu_ok else "changed"))
        if f.has_gpus:
            rows.append(_row(p.name, "gpus_per_node", p.gpus_per_node, f.gpus_per_node))
        rows.append(_row(p.name, "nodes", p.nodes, f.nodes))
        bad = len(f.drained) + len(f.down)
        where = ", ".join([f"{n} drained" for n in f.drained] + [f"{n} down" for n in f.down])
        rows.append(Drift(p.name, "nodes available", str(p.nodes), f"{f.nodes - bad}" + (f" ({where})" if where else ""),
                          "changed" if bad else "ok"))
        if p.cpus_per_node != 1 and f.cpus_per_node is not None:  # 1: the schema default, i.e. not set
            rows.append(_row(p.name, "cpus_per_node", p.cpus_per_node, f.cpus_per_node))
        if f.mem_gib is not None:
            rows.append(Drift(p.name, "mem_gib", f"{p.mem_gib:g}", str(f.mem_gib),
                              "ok" if abs(p.mem_gib - f.mem_gib) < 1 else "changed"))
        if p.time_limit or f.time_limit:
            rows.append(Drift(p.name, "time_limit", str(p.time_limit or "unlimited"), str(f.time_limit or "unlimited"),
                              "ok" if _minutes(p.time_limit) == _minutes(f.time_limit) else "changed"))
    names = {p.name for p in inventory.partitions}
    for f in facts:
        if f.name not in names and f.nodes:
            rows.append(Drift(f.name, "partition", "absent", f"{f.nodes} node(s), {f.gres_label if f.has_gpus else 'no GPUs'}",
                              "extra"))
    return rows


def _row(part: str, what: str, inv, now) -> Drift:
    return Drift(part, what, str(inv), str(now), "ok" if inv == now else "changed")


def _minutes(value: str | None):
    if value is None:
        return None

    try:
        return parse_slurm_time(value, "time_limit")
    except JobctlError:  # not a Slurm time: compare the text
        return value


def has_drift(rows: list[Drift]) -> bool:
    return any(r.status != "ok" for r in rows)
