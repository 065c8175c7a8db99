"""Pydantic models of recipes and inventories: the boundary where YAML becomes typed values.

Every model forbids unknown keys (a typo is an error with a "did you mean"). Inside the
planner, plain frozen dataclasses are used instead (see planner/).
"""

from __future__ import annotations

import os
from typing import Annotated, Literal

# pydantic scans every installed distribution's entry points for plugins on first use
# (~10 ms here); jobctl uses none. Set the variable yourself to keep plugins enabled.
os.environ.setdefault("PYDANTIC_DISABLE_PLUGINS", "__all__")

from pydantic import BaseModel, ConfigDict, Field, StringConstraints, field_validator, model_validator

Auto = Literal["auto"]
Optimizer = Literal["adamw", "adam8bit", "adafactor", "lion", "adam-mini", "sgd", "sgd-momentum"]
Precision = Literal["bf16-mixed", "bf16-pure", "fp16-mixed", "fp32", "fp8", "mxfp8", "nvfp4"]
# The scaling recipes of `precision: fp8`: Transformer Engine's, as Megatron-Core names them
# (per-tensor current scaling, "tensorwise", Megatron-Bridge's FP8-CS; delayed scaling from an
# amax history; 1x128/128x128 block scaling), and torchao's row-wise scaling (torchtitan's
# Float8LinearConverter). mxfp8 and nvfp4 are recipes of their own.
Fp8Recipe = Literal["tensorwise", "delayed", "blockwise", "rowwise"]
Method = Literal["full", "lora", "qlora"]
Attention = Literal["flash", "sdpa", "eager"]
FrameworkName = Literal["custom", "generic", "megatron", "torchtitan", "deepspeed", "fsdp"]
Sharding = Literal["none", "zero1", "zero2", "zero3", "hsdp"]
Recompute = Literal["none", "selective", "full"]
Offload = Literal["none", "optimizer", "optimizer+params"]

# Sanity bounds: larger values are typos, not models (the largest dense models published
# have ~1e5 hidden; a cluster of 1e6 GPUs does not exist yet).
MAX_DIM = 1 << 20
MAX_PARTITIONS = 64  # per inventory
MAX_GPUS = 1 << 21  # in all an inventory's partitions: 2,097,152 (16,384 nodes of 8 is 131,072)


class _Strict(BaseModel):
    # inf and nan are never a learning rate, a memory size or a fraction: refused everywhere
    model_config = ConfigDict(extra="forbid", frozen=True, allow_inf_nan=False)


Dim = int  # validated by field constraints below


class MoEArch(_Strict):
    """The routed feed-forward of a mixture-of-experts model (model.moe)."""

    experts: int = Field(gt=1, le=65536, description="routed experts per MoE layer")
    top_k: int = Field(gt=0, le=1024, description="experts each token is routed to")
    expert_ffn_hidden: int = Field(gt=0, le=8 * MAX_DIM, description="one expert's intermediate width")
    shared_experts: int = Field(default=0, ge=0, le=64)
    shared_expert_ffn_hidden: int = Field(default=0, ge=0, le=8 * MAX_DIM, description="0: expert_ffn_hidden")
    first_dense_layers: int = Field(default=0, ge=0, le=10_000)
    moe_every: int = Field(default=1, gt=0, le=64, description="every n-th layer is MoE (Llama 4 Maverick: 2)")
    router_bias: bool = False
    score_bias: bool = Field(default=False, description="DeepSeek-V3's per-expert score-correction bias")
    expert_bias: bool = False
    expert_groups: int = Field(default=0, ge=0, le=4096, description="group-limited routing (DeepSeek-V3: 8): the "
                               "experts in groups, a token's top_k drawn from the best expert_groups_kept of them")
    expert_groups_kept: int = Field(default=0, ge=0, le=4096, description="groups a token may use (DeepSeek-V3: 4)")
    # the router's load-balancing regime: dropless (every token reaches its experts, whatever the
    # imbalance), or a capacity factor (an expert takes at most factor x its even share)
    capacity_factor: float | None = Field(default=None, gt=0, le=64)

    @model_validator(mode="after")
    def _k(self):
        if self.top_k > self.experts:
            raise ValueError(f"top_k ({self.top_k}) cannot exceed experts ({self.experts})")
        g, kept = self.expert_groups, self.expert_groups_kept
        if g and (self.experts % g or self.experts // g < 2):
            raise ValueError(f"expert_groups ({g}) must divide experts ({self.experts}) into groups of 2 or more")
        if bool(g) != bool(kept) or kept > g:
            raise ValueError(f"expert_groups_kept ({kept}) must be set with expert_groups ({g}), and at most it")
        if g and self.top_k > kept * (self.experts // g):
            raise ValueError(f"top_k ({self.top_k}) exceeds the experts of the {kept} groups a token may use")
        return self


class AttentionArch(_Strict):
    """model.attention: grouped-query (the default) or DeepSeek's multi-head latent attention."""

    kind: Literal["gqa", "mla"] = "gqa"
    head_dim: int | None = Field(default=None, gt=0, le=MAX_DIM, description="gqa: a width other than hidden/heads")
    qk_norm: bool = False
    bias: bool = False
    sinks: bool = False
    sliding_window: int = Field(default=0, ge=0, le=16 * MAX_DIM, description="gqa: a window of this many tokens "
                                "(gpt-oss: 128); 0: none")
    full_every: int = Field(default=0, ge=0, le=10_000, description="with a window: every n-th layer attends to the "
                            "whole sequence (gpt-oss: 2); 0: every layer windowed")
    q_lora_rank: int = Field(default=0, ge=0, le=MAX_DIM, description="mla: 0 = a full query projection")
    kv_lora_rank: int = Field(default=0, ge=0, le=MAX_DIM)
    qk_rope_head_dim: int = Field(default=0, ge=0, le=MAX_DIM)
    qk_nope_head_dim: int = Field(default=0, ge=0, le=MAX_DIM)
    v_head_dim: int = Field(default=0, ge=0, le=MAX_DIM)

    @model_validator(mode="after")
    def _mla(self):
        if self.kind == "mla" and not (self.kv_lora_rank and self.qk_rope_head_dim and self.qk_nope_head_dim
                                       and self.v_head_dim):
            raise ValueError("kind mla needs kv_lora_rank, qk_rope_head_dim, qk_nope_head_dim and v_head_dim")
        if self.kind == "mla" and self.sliding_window:
            raise ValueError("sliding_window is for kind gqa (no MLA model in jobctl's presets has one)")
        if self.full_every and not self.sliding_window:
            raise ValueError("full_every says which layers are not windowed: set sliding_window too, or drop it")
        return self


class ModelArch(_Strict):
    """An explicit architecture, instead of a preset name."""

    name: str = "custom"
    family: Literal["llama", "gpt"]
    layers: int = Field(gt=0, le=10_000)
    hidden: int = Field(gt=0, le=MAX_DIM)
    ffn_hidden: int = Field(gt=0, le=8 * MAX_DIM)
    heads: int = Field(gt=0, le=MAX_DIM)
    kv_heads: int | None = Field(default=None, gt=0, le=MAX_DIM)
    vocab: int = Field(gt=0, le=16 * MAX_DIM)
    tied_embeddings: bool = False
    max_seq_len: int = Field(default=0, ge=0, le=16 * MAX_DIM)
    dropout: float = Field(default=0.0, ge=0.0, lt=1.0)
    rope_theta: float = Field(default=10000.0, gt=0, le=1e9, description="RoPE base")
    rope_scaling: float = Field(default=0.0, ge=0, le=1024, description="Llama 3.1-style RoPE scaling factor; 0: none")
    norm_eps: float = Field(default=1e-5, gt=0, le=1e-2)
    moe: MoEArch | None = None
    attention: AttentionArch | None = None
    mtp_layers: int = Field(default=0, ge=0, le=64, description="multi-token-prediction modules (DeepSeek-V3)")
    activation: Literal["swiglu", "clamped-geglu"] = Field(
        default="swiglu", description="llama: the gated MLP's activation (gpt-oss: clamped-geglu)")

    @model_validator(mode="after")
    def _shapes(self):
        if self.hidden % self.heads and not (self.attention and (self.attention.head_dim or self.attention.kind == "mla")):
            raise ValueError(f"hidden ({self.hidden}) must be divisible by heads ({self.heads}), or give "
                             "attention.head_dim")
        g = self.kv_heads or self.heads
        if self.heads % g:
            raise ValueError(f"heads ({self.heads}) must be divisible by kv_heads ({g})")
        return self


class Train(_Strict):
    seq_len: int = Field(gt=0, le=16 * MAX_DIM)
    global_batch_size: int = Field(gt=0, le=1 << 24, description="sequences per optimizer step")
    optimizer: Optimizer = "adamw"
    precision: Precision = "bf16-mixed"
    fp8_recipe: Fp8Recipe | None = Field(
        default=None, description="with precision fp8; default: the framework's first (tensorwise; torchtitan rowwise)")
    # the precision of the data-parallel gradient reduction and of Megatron's main-grad buffer
    # (--grad-reduce-in-bf16): bf16 halves the buffer. auto: bf16 under Megatron with a bf16 or
    # low-precision recipe, as every one of Megatron-Bridge's perf recipes runs
    # (perf_recipes/_common.py: grad_reduce_in_fp32 = False); fp32 elsewhere
    grad_reduce: Literal["auto", "fp32", "bf16"] = "auto"
    method: Method = "full"
    lora_rank: int = Field(default=16, gt=0, le=65536)
    lora_targets: list[Literal["q", "k", "v", "o", "gate", "up", "down", "fc1", "fc2", "qkv"]] = Field(
        default_factory=lambda: ["q", "k", "v", "o", "gate", "up", "down"]
    )
    attention: Attention = "flash"
    # Megatron: turn on its fused loss (--cross-entropy-loss-fusion, 10 B per logit, measured);
    # "te": Megatron with Transformer Engine's kernel (--cross-entropy-fusion-impl te, as NVIDIA's
    # perf recipes run it: the gradient written into the 16-bit logits, 2 B per logit);
    # other frameworks: the training code brings its own chunked/fused loss (16-bit logits only)
    fused_cross_entropy: bool | Literal["te"] = False
    # torch.compile of the model (torchtitan --compile.enable; with tp > 1 also its async TP):
    # auto turns it on where jobctl renders and models it (torchtitan, as its published benchmark
    # runs are compiled), off elsewhere; true where the framework has no compile is refused.
    # Compiled, a dense block keeps less for backward (docs/memory-model.md §3, measured)
    compile: Literal["auto"] | bool = "auto"
    # the forward and backward captured as one CUDA graph (torchtitan 0.3.0's default, which it
    # cannot do under pipeline or expert parallelism): auto leaves it on where the framework can;
    # false renders --training.disable_cuda_graphs (the trainer then frees gradients each step)
    cuda_graphs: Literal["auto"] | bool = "auto"
    # a mixture of experts' all-to-alls under the next micro-batch's compute (Megatron's
    # --overlap-moe-expert-parallel-comm, its combined 1F1B schedule): auto turns it on wherever
    # megatron-core accepts it (true: the same, refused for a framework without it); false leaves
    # it off (one layer less held, every all-to-all exposed)
    ep_overlap: Literal["auto"] | bool = "auto"
    # how a mixture of experts' tokens reach their experts: alltoall (Megatron's default, NCCL
    # all-to-alls: a token's copy for each expert on another node crosses the network), hybridep
    # (Megatron-Core's flex dispatcher on DeepEP's HybridEP kernels, which the container must
    # have: a token crosses to each other NVLink domain once and is fanned out there over NVLink)
    # or deepep (the flex dispatcher on DeepEP's normal kernels: the same, between 8-GPU nodes)
    moe_dispatcher: Literal["alltoall", "hybridep", "deepep"] = "alltoall"
    # what parallelism.recompute: selective recomputes under Megatron (--recompute-modules): auto
    # (MLA's up-projection and the experts' SwiGLU where the model has them, else the attention
    # core), or a list of core_attn, mla_up_proj, moe_act, mlp (the dense layers' MLP),
    # shared_experts (a mixture of experts' shared MLP)
    recompute_modules: Literal["auto"] | list[Literal["core_attn", "mla_up_proj", "moe_act", "mlp",
                                                      "shared_experts"]] = "auto"

    @field_validator("recompute_modules")
    @classmethod
    def _some_modules(cls, v):
        if v != "auto" and not v:
            raise ValueError("an empty list recomputes nothing: name modules (core_attn, mla_up_proj, moe_act, mlp, "
                             "shared_experts), or use auto, or parallelism.recompute: none")
        return v
    # a trillion steps, a quintillion tokens: more is a typo, and a 400-digit number made the
    # time-to-train arithmetic overflow (OverflowError)
    steps: int | None = Field(default=None, gt=0, le=10**12)
    tokens: int | None = Field(default=None, gt=0, le=10**18)
    # The schedule and the optimizer's settings, rendered in each framework's own names (README:
    # Frameworks); the defaults are the Llama 3 paper's (AdamW 0.9/0.95, weight decay 0.1, clip 1.0).
    lr: float | None = Field(default=None, gt=0, le=10)
    min_lr: float | None = Field(default=None, ge=0, le=10)
    warmup_steps: int | None = Field(default=None, ge=0, le=10**12)
    # steps between checkpoints, rendered in the framework's flags; unset: the plan's interval
    # (Young's, planner/resilience.py)
    checkpoint_interval: int | None = Field(default=None, gt=0, le=10**12)
    lr_schedule: Literal["cosine", "linear", "constant"] = "cosine"
    weight_decay: float = Field(default=0.1, ge=0, le=10)
    adam_beta1: float = Field(default=0.9, ge=0, lt=1)
    adam_beta2: float = Field(default=0.95, ge=0, lt=1)
    adam_eps: float = Field(default=1e-8, gt=0, le=1)
    grad_clip: float = Field(default=1.0, ge=0, le=1e6, description="0: no clipping")
    seed: int = Field(default=1234, ge=0, lt=1 << 32)

    @model_validator(mode="after")
    def _schedule(self):
        if self.min_lr is not None and self.lr is not None and self.min_lr > self.lr:
            raise ValueError(f"min_lr ({self.min_lr:g}) is above lr ({self.lr:g})")
        if self.warmup_steps and self.steps and self.warmup_steps > self.steps:
            raise ValueError(f"warmup_steps ({self.warmup_steps}) is more than steps ({self.steps})")
        if self.fp8_recipe is not None and self.precision != "fp8":
            raise ValueError(f"fp8_recipe is the scaling of precision fp8, and precision is {self.precision} "
                             "(set precision: fp8, or remove fp8_recipe)")
        return self


class Tokenizer(_Strict):
    """The recipe's tokenizer: `null` (synthetic data, the model's vocabulary size; Megatron's
    NullTokenizer), or a Hugging Face / SentencePiece / tiktoken tokenizer at `path`."""

    type: Literal["null", "huggingface", "sentencepiece", "tiktoken"] = "null"
    path: str | None = Field(default=None, min_length=1, max_length=4096)

    @model_validator(mode="after")
    def _path(self):
        if self.type != "null" and not self.path:
            raise ValueError(f"tokenizer type {self.type} needs a path (the tokenizer's file or folder)")
        return self


class Parallelism(_Strict):
    tp: int | Auto = "auto"
    pp: int | Auto = "auto"
    dp: int | Auto = "auto"
    cp: int | Auto = "auto"
    sharding: Sharding | Auto = "auto"
    micro_batch_size: int | Auto = "auto"
    recompute: Recompute | Auto = "auto"
    offload: Offload | Auto = "auto"
    sequence_parallel: bool | Auto = "auto"
    # interleaved pipeline chunks per rank: 1 pins the plain (1F1B) schedule, "auto" lets the
    # search choose (it interleaves when the bubble pays for it)
    virtual_stages: int | Auto = "auto"
    # expert parallelism (a mixture of experts): ranks of a pipeline stage that split its experts
    ep: int | Auto = "auto"

    @field_validator("virtual_stages")
    @classmethod
    def _chunks(cls, v):
        if isinstance(v, int) and not 0 < v <= 128:
            raise ValueError("must be between 1 and 128 (model chunks per pipeline rank), or auto")
        return v

    @field_validator("tp", "pp", "dp", "cp", "ep", "micro_batch_size")
    @classmethod
    def _positive(cls, v):
        if isinstance(v, int) and not 0 < v <= MAX_DIM:
            raise ValueError(f"must be a positive integer up to {MAX_DIM} or 'auto', got {v}")
        return v


class MemoryKnobs(_Strict):
    """Overrides of the memory model's named overhead terms (see planner/memory.py)."""

    cuda_context_gib: float | None = Field(default=None, ge=0, le=64)
    nccl_gib: float | None = Field(default=None, ge=0, le=64)
    safety_margin_gib: float | None = Field(default=None, ge=0, le=512)
    allocator_reserve_fraction: float | None = Field(default=None, ge=0, lt=1)
    expandable_segments: bool | None = None
    host_reserve_gib: float | None = Field(default=None, ge=0, le=1 << 16)


NODE_LIST = r"^[A-Za-z0-9][A-Za-z0-9._\-]*(\[[0-9,\-]+\][A-Za-z0-9._\-]*)?$"  # a name or a Slurm range


class Resources(_Strict):
    time: str | None = None  # Slurm time limit, e.g. "04:00:00" or "2-00:00:00"
    max_nodes: int | None = Field(default=None, gt=0)
    nodes: int | None = Field(default=None, gt=0, description="exactly this many whole nodes")
    # nodes the job must not run on (sbatch --exclude): names or Slurm ranges such as gpu[03-05]
    exclude: list[Annotated[str, StringConstraints(pattern=NODE_LIST, max_length=256)]] = Field(
        default_factory=list, max_length=4096)
    # seconds without a new training step before the runner calls the job hung (the first step
    # gets three times as long); unset: derived from the plan's step time; 0: never
    hang_after: int | None = Field(default=None, ge=0, le=7 * 86400)

    @field_validator("hang_after")
    @classmethod
    def _hang_after(cls, v):
        if v is not None and 0 < v < 5:
            raise ValueError("must be 0 (no hang watchdog) or at least 5 seconds")
        return v

    @model_validator(mode="after")
    def _nodes_within_max(self):
        if self.nodes is not None and self.max_nodes is not None and self.nodes > self.max_nodes:
            raise ValueError(f"nodes ({self.nodes}) exceeds max_nodes ({self.max_nodes}); keep one of them")
        return self
    partition: str | None = None


class Launch(_Strict):
    command: str | list[str] | None = None
    launcher: Literal["torchrun", "none"] = "torchrun"
    env: dict[str, str] = Field(default_factory=dict)
    hooks: bool = Field(default=False, description="start jobctl.hooks in every training process (sitecustomize)")


class Supports(_Strict):
    """What a `custom` framework's code runs (jobctl.frameworks.custom); unset = the default."""

    tp: bool | None = None
    pp: bool | None = None
    cp: bool | None = None
    sequence_parallel: bool | None = None
    interleaved: bool | None = None
    recompute_layers: bool | None = None
    sharding: list[Sharding] | None = Field(default=None, min_length=1)
    recompute: list[Recompute] | None = Field(default=None, min_length=1)
    offload: list[Offload] | None = Field(default=None, min_length=1)

    @model_validator(mode="after")
    def _consistent(self):
        if self.sequence_parallel and not self.tp:
            raise ValueError("sequence_parallel needs tp: true (it splits what tensor parallelism replicates)")
        if self.interleaved and not self.pp:
            raise ValueError("interleaved needs pp: true (it is a pipeline schedule)")
        return self


class FrameworkSpec(_Strict):
    """`framework: {name: ..., supports: {...}}`; supports only for custom (own code)."""

    name: FrameworkName
    supports: Supports | None = None
    # the release the job's environment has (jobctl warns when it renders for another)
    version: str | None = Field(default=None, min_length=1, max_length=40, pattern=r"^[0-9A-Za-z.+_-]+$")

    @model_validator(mode="after")
    def _supports_custom_only(self):
        if self.supports is not None and self.name not in ("custom", "generic"):
            raise ValueError(f"supports is for framework custom (your own code); {self.name}'s capabilities "
                             "are jobctl's tables (README: Frameworks)")
        return self


class Recipe(_Strict):
    name: str = Field(min_length=1, max_length=200)
    model: str | ModelArch
    train: Train
    framework: FrameworkName | FrameworkSpec = "custom"
    parallelism: Parallelism = Field(default_factory=Parallelism)
    memory: MemoryKnobs = Field(default_factory=MemoryKnobs)
    resources: Resources = Field(default_factory=Resources)
    launch: Launch = Field(default_factory=Launch)
    tokenizer: Tokenizer = Field(default_factory=Tokenizer)
    description: str = ""


class Partition(_Strict):
    name: str = Field(min_length=1)
    gpu: str
    gpus_per_node: int = Field(gt=0, le=64)
    nodes: int = Field(gt=0, le=1 << 17)
    cpus_per_node: int = Field(default=1, gt=0, le=1 << 14)
    mem_gib: float = Field(gt=0, le=1 << 16, description="host RAM per node")
    gpu_memory_gib: float | None = Field(default=None, gt=0, le=4096, description="override the catalog")
    intra_node_gbs: float | None = Field(default=None, gt=0)
    inter_node_gbit: float | None = Field(default=None, gt=0, description="per GPU")
    inter_node_gbit_per_node: float | None = Field(default=None, gt=0)
    pcie_gbs: float | None = Field(default=None, gt=0)
    time_limit: str | None = None
    # GPUs one NVLink domain spans, when it spans several nodes (a GB200 NVL72 rack: 72 GPUs, 4
    # per node); default: the catalog's for the GPU, else one node
    nvlink_domain_gpus: int | None = Field(default=None, gt=0, le=1 << 12)
    # planning for failures (planner/resilience.py): a node's share of the file system's write
    # bandwidth when all write their checkpoint shards (default 2 GB/s), and how often a node
    # interrupts a job (default: the Llama 3 paper's 419 in 54 days on 2,048 nodes)
    checkpoint_write_gbs_per_node: float | None = Field(default=None, gt=0, le=1e4)
    interruptions_per_node_day: float | None = Field(default=None, ge=0, le=100)

    @model_validator(mode="after")
    def _domain(self):
        d = self.nvlink_domain_gpus
        if d is not None and d % self.gpus_per_node:
            raise ValueError(f"nvlink_domain_gpus ({d}) must be a whole number of nodes of {self.gpus_per_node} GPUs")
        return self


class SlurmOptions(_Strict):
    account: str | None = None
    qos: str | None = None
    constraint: str | None = None
    gres: str | None = None  # default: gpu:<gpus_per_node>
    additional: dict[str, str | int | bool] = Field(default_factory=dict)
    setup: list[str] = Field(default_factory=list)


class Login(_Strict):
    """How to reach a cluster's login node over SSH (jobctl.remote.ssh); ~/.ssh/config is honoured.

    Values set here win over the ssh config's (as on the ssh command line); unset ones come
    from the config entry for `host` (HostName, User, Port, IdentityFile, ProxyJump)."""

    host: str = Field(min_length=1, description="host name, address or ~/.ssh/config alias")
    user: str | None = Field(default=None, min_length=1)
    port: int | None = Field(default=None, gt=0, le=65535)
    key_file: str | None = Field(default=None, min_length=1, description="private key (the ssh agent is used too)")
    known_hosts: str = "~/.ssh/known_hosts"
    remote_python: str = Field(default="python3", min_length=1, description="python with jobctl on the login node")
    workdir: str = Field(default="~/jobctl", min_length=1, description="jobctl's directory on the login node")
    connect_timeout_s: float = Field(default=10, gt=0, le=600)
    ssh_config: str = "~/.ssh/config"

    @field_validator("host")
    @classmethod
    def _bare_host(cls, v: str) -> str:
        if "@" in v or any(c.isspace() for c in v) or v.startswith("-"):
            raise ValueError(f"must be a bare host name or ssh alias, got {v!r} (put the user in `user:`, "
                             "the port in `port:`)")
        return v


class Inventory(_Strict):
    name: str = Field(min_length=1)
    scheduler: Literal["slurm", "local"] = "slurm"
    description: str = ""
    # the search runs once per partition: a bound on the partitions and on the GPUs in all keeps
    # one plan within seconds (thousands of 131,072-node partitions took hours)
    partitions: list[Partition] = Field(min_length=1, max_length=MAX_PARTITIONS)
    env: dict[str, str] = Field(default_factory=dict)
    slurm: SlurmOptions = Field(default_factory=SlurmOptions)
    memory: MemoryKnobs = Field(default_factory=MemoryKnobs)
    workdir: str | None = Field(default=None, description="where job folders live (shared with the nodes); "
                                "default: $JOBCTL_HOME/jobs")
    login: Login | None = Field(default=None, description="reach the cluster over SSH (runs jobctl on the login node)")

    @model_validator(mode="after")
    def _unique(self):
        names = [p.name for p in self.partitions]
        dup = sorted({n for n in names if names.count(n) > 1})
        if dup:
            raise ValueError(f"partition names must be unique, repeated: {', '.join(dup)}")
        gpus = sum(p.nodes * p.gpus_per_node for p in self.partitions)
        if gpus > MAX_GPUS:
            raise ValueError(f"the partitions hold {gpus:,} GPUs in all, more than the {MAX_GPUS:,} jobctl plans for; "
                             "list the partitions a recipe can use (an inventory per system)")
        return self
