"""What a training framework can run, as a value the planner reads (SkyPilot's capability
declarations, for frameworks): the planner searches only inside it, and a framework module
renders a plan in the framework's own names.

Pure: plans, workloads and models are read by attribute (no planner import), so the planner
can import this package and not the other way round.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field, replace
from typing import Any

from jobctl.model import CHECKPOINT_DIR_TOKEN, JOB_FOLDER_TOKEN, StrEnum

# train.precision values that need the GPU's low-precision tensor cores (catalog GPUSpec.formats)
LOW_PRECISIONS = ("fp8", "mxfp8", "nvfp4")

NONE = "none"


class Selective(StrEnum):
    """What "selective" recomputation keeps, which differs by framework."""

    NOT_OFFERED = "not offered"
    CORE_ATTENTION = "core attention"  # Megatron: recompute the attention core (its a·s² scores), keep the rest
    OP_SAC = "op-level SAC"  # torchtitan: save every second matmul's output, attention and comms; recompute the rest


class StateRecipe(StrEnum):
    """How a framework keeps model states under mixed precision (docs/memory-model.md §2)."""

    ZERO = "16-bit weights and grads, fp32 master and states"  # DeepSpeed, the ZeRO paper: 2 + 2 + 12
    MEGATRON = "16-bit weights, fp32 main grads, fp32 master and states"  # 2 + 4 + 12
    FP32_PARAMS = "fp32 (sharded) parameters as the master, fp32 grads and states"  # FSDP2, torchtitan: 4 + 4 + 8


class GradBuffer(StrEnum):
    """The gradient communication buffer beside the gradients themselves."""

    DDP_BUCKETS = "DDP buckets"  # torch DDP: a copy of the gradients in flat buckets
    REDUCE_BUCKET = "reduce bucket"  # DeepSpeed: reduce_bucket_size elements
    NONE = "none"  # Megatron's contiguous main-grad buffer is the gradients


@dataclass(frozen=True)
class Capabilities:
    """What one framework can run, each fact with where it was read (`sources`)."""

    name: str
    title: str
    # the distribution it ships as, the releases its rendering was read from and checked against,
    # and known breakages with other packages' releases: (package, version prefix, what breaks)
    package: str = ""
    versions: tuple[str, ...] = ()
    skews: tuple[tuple[str, str, str], ...] = ()
    tp: bool = False
    sequence_parallel: str = "no"  # "no" | "optional" (a flag) | "with tp" (on whenever tp > 1 by default)
    cp: bool = False
    pp: bool = False
    schedules: tuple[str, ...] = ()  # pipeline schedules it ships, in its own names
    interleaved: bool = False  # virtual pipeline stages (an interleaved schedule)
    shardings: tuple[str, ...] = ("none",)
    recompute: tuple[str, ...] = ("none",)
    selective: Selective = Selective.NOT_OFFERED
    recompute_layers: bool = False  # full recompute of only N layers per stage
    # "selective" recomputes named submodules (Megatron-Core's --recompute-modules), of which
    # jobctl models these (train.recompute_modules; recompute_modules below)
    recompute_modules: tuple[str, ...] = ()
    offload: tuple[str, ...] = ("none",)
    optimizers: tuple[str, ...] = ("adamw",)
    methods: tuple[str, ...] = ("full",)  # full | lora | qlora
    precisions: tuple[str, ...] = ("bf16-mixed", "fp16-mixed", "fp32")
    # why fp8/mxfp8/nvfp4 are not among `precisions`, in the framework's terms (shown with the refusal)
    low_precision_note: str = ""
    # the scalings of precision fp8 it renders, its default first (train.fp8_recipe)
    fp8_recipes: tuple[str, ...] = ("tensorwise", "delayed", "blockwise")
    # whose low-precision GEMMs it runs: Transformer Engine's modules (Megatron) or torchao's
    # Float8Linear (torchtitan; accelerate's AO backend), whose efficiency, casts and memory differ
    # (planner/memory/workload.py low_precision_format)
    fp8_backend: str = "transformer-engine"
    # under FSDP2 the Float8 layers' weights are all-gathered in FP8 (torchao Float8LinearConfig
    # enable_fsdp_float8_all_gather: accelerate's AORecipeKwargs turns it on by default)
    fsdp_float8_all_gather: bool = False
    # under precision fp8 with FSDP every rank loads the whole model into host memory and upcasts
    # it to fp32 before sharding it (accelerate refuses cpu_ram_efficient_loading with torchao)
    fp8_loads_model_per_rank: bool = False
    vocab_multiple_per_tp: int = 1  # the vocabulary is padded to a multiple of this x tp
    state_recipe: StateRecipe = StateRecipe.ZERO
    reduce_bytes: int = 2  # bytes per gradient element in the data-parallel reduction
    grad_buffer: GradBuffer = GradBuffer.DDP_BUCKETS
    # how the data-parallel traffic of ZeRO-1/2 and of plain replicas runs beside the compute
    # (planner/perf.py _data_parallel): "overlapped" (DDP's buckets, Megatron's --overlap-grad-reduce
    # and --overlap-param-gather: the reduce under the backward, the gather under the next forward)
    # or "zero-engine" (DeepSpeed: without ZeRO the engine all-reduces after the backward; ZeRO-1/2
    # reduce on a side stream under the backward with overlap_comm, ZeRO-2 at every micro-batch,
    # and gather the updated weights inside optimizer.step)
    dp_schedule: str = "overlapped"
    fused_kernels: bool = False  # fused norms and GQA-native attention (Megatron/TE, torchtitan) vs eager HF layers
    te_layernorm_mlp: bool = False  # Transformer Engine's LayerNormMLP (keeps 3 of the 4 SwiGLU tensors)
    # tensor-parallel collectives overlapped with the GEMMs when sequence parallel (Megatron's
    # --tp-comm-overlap on Transformer Engine's userbuffers; planner/perf.py tp_overlap)
    tp_comm_overlap: bool = False
    # FP8 weights all-gathered in FP8 under the distributed optimizer (Megatron's --fp8-param-gather;
    # planner/memory/workload.py fp8_params)
    fp8_param_gather: bool = False
    # torch.compile of the model, rendered and modelled (train.compile); async TP under it
    compiles: bool = False
    async_tp: bool = False
    reshard_under_pp: bool = True  # FSDP reshards parameters after forward when pipelining
    offload_keeps_grads: bool = False  # optimizer offload leaves the gradient buffer on the GPU
    # the 16-bit logits live until the loss's backward (False: the training loop drops them
    # once the loss is computed, and only the fp32 log-probabilities and gradients remain)
    keeps_logits_through_loss: bool = True
    fused_qkv: bool = False  # one wqkv matmul instead of wq, wk, wv (changes op-level SAC's saved set)
    # under sequence parallelism the column-parallel matmuls keep their all-gathered (whole
    # sequence) input for backward; False: they keep the sequence shard and gather it again
    # in backward (Megatron)
    sp_keeps_gathered_input: bool = False
    # bytes per local logit element at the peak of a vocabulary-parallel loss (tp > 1); 0: as
    # without tensor parallelism
    loss_parallel_logit_bytes: float = 0.0
    # the framework's own cross-entropy works in place on one fp32 copy of the logits (Megatron's
    # vocab-parallel loss, at any tp): 16-bit logits + that copy at the peak, instead of
    # PyTorch's log-softmax and two fp32 gradients
    in_place_cross_entropy: bool = False
    # bytes per logit at the peak of the framework's own fused cross-entropy, which jobctl turns on
    # when the recipe asks for fused_cross_entropy (Megatron's --cross-entropy-loss-fusion); 0: the
    # recipe's fused_cross_entropy is taken as the user's own chunked/fused loss (16-bit logits only)
    fused_cross_entropy_logit_bytes: float = 0.0
    # train.fused_cross_entropy: te runs Transformer Engine's cross-entropy kernel (Megatron's
    # --cross-entropy-fusion-impl te): the 16-bit logits kept, their gradient written in place
    te_cross_entropy: bool = False
    # the training loop frees the (sharded) gradients every step (zero_grad(set_to_none=True)),
    # so under FSDP they do not exist at the activation peak of a one-micro-batch step
    frees_grads_each_step: bool = False
    # the forward and backward are captured as one CUDA graph unless the plan renders it off
    # (torchtitan 0.3.0: on by default; jobctl turns it off under PP and EP, which it refuses),
    # and under it the trainer zeroes the gradients in place (zero_grad(set_to_none=False)):
    # they stay allocated through the step
    cuda_graphs: bool = False
    # the loss runs the output layer and the cross-entropy a sequence chunk at a time (torchtitan
    # 0.3.0's ChunkedLossWrapper, in every registry config: 8 chunks), accumulating the hidden
    # state's gradient in fp32 and the output layer's unsharded gradient across the chunks; 0: whole
    loss_chunks: int = 0
    # FSDP's root unit holds the embedding with the output layer (HF accelerate wraps the decoder
    # layers, then the root): at the loss both are gathered, and the last layer is prefetched
    fsdp_root_holds_embeddings: bool = False
    # HF's SDPA attention hands grouped K/V to the kernel (enable_gqa) when there is no mask,
    # instead of repeat_kv copies up to the query heads (eager attention still copies)
    sdpa_gqa: bool = False
    # the default pipeline split counts the embedding and the output layer as one layer each and
    # spreads the L + 2 over the stages, the first ones taking the remainder (torchtitan); False:
    # even splits, or the first/last stage one layer short (Megatron-LM's uneven option)
    pp_split_counts_ends: bool = False
    # any split of the layers over the (virtual) stages can be written down (Megatron's
    # --pipeline-model-parallel-layout): the search also offers power-of-two pipelines no even
    # split takes, with the last stage short (stage_layers' front_loaded)
    pipeline_layout: bool = False
    # the pipeline runs torch.distributed.pipelining's PipelineStage, which allocates a receive
    # buffer per micro-batch for every boundary tensor it receives (activations from the previous
    # stage, gradients from the next) and keeps them all through the step
    pp_stage_recv_buffers: bool = False
    # mixtures of experts (expert parallelism, routed experts, their dispatcher), rendered and
    # modelled; DeepSeek's multi-head latent attention (mla)
    moe: bool = False
    mla: bool = False
    # gpt-oss's attention sinks, biases on every linear, sliding-window layers and clamped GEGLU
    # (Megatron: --softmax-type learnable, --add-qkv-bias, --window-size, --quick-geglu)
    gpt_oss: bool = False
    # the routed experts' work is launched expert by expert from the host at each micro-batch,
    # after a device-to-host sync of the token counts that keeps the host from running ahead
    # (Megatron-Core 0.16.1 moe/experts.py TEGroupedMLP.forward: tokens_per_expert.tolist(), the
    # m_splits of Transformer Engine's GroupedLinear, which loops over the local experts' GEMMs
    # and casts; whatever the dispatcher); planner/perf.py MOE_HOST_S_PER_EXPERT. False: one
    # grouped kernel for all (torchtitan's torch._grouped_mm)
    moe_expert_launches: bool = False
    # one micro-batch's expert-parallel all-to-alls under another's compute (Megatron-Core's
    # --overlap-moe-expert-parallel-comm with --delay-wgrad-compute: the combined 1F1B schedule;
    # planner/perf.py and memory, ep_overlap below)
    ep_overlap: bool = False
    # the token dispatchers jobctl renders and models (train.moe_dispatcher): alltoall everywhere;
    # hybridep, deepep: Megatron-Core's flex dispatcher on DeepEP's HybridEP or normal kernels
    # (flex_backend)
    moe_dispatchers: tuple[str, ...] = ("alltoall",)
    # the model's multi-token-prediction modules (DeepSeek-V3's; model.mtp_layers) are built and
    # trained on the last pipeline stage (Megatron-Core's --mtp-num-layers); without it the plan
    # trains the main model only
    mtp: bool = False
    # the MoE layer is torchtitan's eager one (models/common/moe.py, token_dispatcher.py): the
    # router's gate runs under autocast to fp32 and keeps an fp32 copy of its input and the
    # probabilities; the dispatcher sorts the copies by expert with int64 indices; the combine
    # weights each copy's output in fp32 and keeps that fp32 copy; the norm's 16-bit output is
    # kept only by shared experts. False: Megatron-Core's layer (TE grouped GEMMs, alltoall)
    moe_fp32_copies: bool = False
    sources: tuple[tuple[str, str], ...] = ()  # (fact, where it was read)

    def offers(self, what: str, value: Any) -> bool:
        """Whether a plan knob value is one this framework runs (by its capability table)."""
        table = {"sharding": self.shardings, "recompute": self.recompute, "offload": self.offload}
        return value in table[what]


@dataclass(frozen=True)
class Rendered:
    """A plan in a framework's own names: command-line arguments, files and environment. A
    file's name is its key; its path in the job is `<job folder>/framework/<key>`."""

    name: str
    args: tuple[str, ...] = ()
    files: dict[str, str] = field(default_factory=dict)
    env: dict[str, str] = field(default_factory=dict)
    notes: tuple[str, ...] = ()
    # the communication the rendered flags run under compute, in words (the plan shows it)
    overlaps: tuple[str, ...] = ()
    # the same plan as Hugging Face Trainer's arguments, where they differ from `args`
    # (${framework.hf_args}: DeepSpeed under the Trainer)
    hf_args: tuple[str, ...] = ()
    # the framework's own launcher's arguments (${framework.launch_args}: `accelerate launch`'s
    # config file, machines, this node's rank and the first node's address)
    launch_args: tuple[str, ...] = ()
    # the end of `args` that the framework's parser needs last in the whole command (torchtrain's
    # tyro subcommand): wherever ${framework.args} stands, these go to the end
    last: tuple[str, ...] = ()

    def to_dict(self) -> dict:
        out = {"name": self.name, "args": list(self.args), "files": dict(self.files), "env": dict(self.env),
               "notes": list(self.notes)}
        for key in ("hf_args", "launch_args", "last", "overlaps"):
            if getattr(self, key):
                out[key] = list(getattr(self, key))
        return out


def num(x: float) -> str:
    """A number as the shortest text that reads back as it (500000, 1e-05, 0.95)."""
    return str(int(x)) if float(x).is_integer() and abs(x) < 1e15 else repr(float(x))


def ratio(a: float, b: float) -> float:
    """a / b without the last bit's noise (3.7e-5 / 3.7e-4 is 0.1, not 0.09999999999999999)."""
    return float(f"{a / b:.12g}")


def hf_training_args(plan, w) -> tuple[str, ...]:
    """The plan and the recipe's training setup as Hugging Face TrainingArguments
    (transformers/training_args.py): the per-device micro-batch, the accumulation, precision,
    and the schedule, optimizer settings, steps and seed the recipe states."""
    t = w.training
    a = ["--per_device_train_batch_size", str(plan.micro_batch_size),
         "--gradient_accumulation_steps", str(plan.grad_accum_steps)]
    a += {"bf16-mixed": ["--bf16"], "fp16-mixed": ["--fp16"]}.get(w.precision, [])
    if t.lr is not None:
        schedule = {"cosine": "cosine", "linear": "linear"}.get(t.schedule, "constant_with_warmup")
        a += ["--learning_rate", num(t.lr), "--lr_scheduler_type", schedule]
    if t.warmup_steps:
        a += ["--warmup_steps", str(t.warmup_steps)]
    if t.steps:
        a += ["--max_steps", str(t.steps)]
    a += ["--weight_decay", num(t.weight_decay), "--max_grad_norm", num(t.grad_clip), "--seed", str(t.seed)]
    if w.optimizer == "adamw":
        a += ["--adam_beta1", num(t.betas[0]), "--adam_beta2", num(t.betas[1]), "--adam_epsilon", num(t.eps)]
    # checkpoint-N folders in the chain's folder; resuming is the script's call
    # (trainer.train(resume_from_checkpoint=$JOBCTL_RESUME_FROM) when JOBCTL_RESUME=1)
    a += ["--output_dir", CHECKPOINT_DIR_TOKEN]
    if t.checkpoint_every:
        a += ["--save_strategy", "steps", "--save_steps", str(t.checkpoint_every)]
    return tuple(a)




def file_path(key: str) -> str:
    """Where a rendered file is in the job, as written in argv (see JOB_FOLDER_TOKEN)."""
    return f"{JOB_FOLDER_TOKEN}/framework/{key}"


@dataclass(frozen=True)
class Framework:
    """A framework as the planner and the launcher use it: capabilities, the combinations it
    refuses, and how a plan becomes its configuration."""

    caps: Capabilities
    problems: Callable[[Any, Any], list[str]]  # (plan, workload) -> what it refuses, with its message
    render: Callable[[Any, Any], Rendered]  # (plan, workload) -> its configuration
    # workload -> what it refuses of the recipe whatever the layout (shown before any search)
    recipe_problems: Callable[[Any], list[str]] | None = None

    @property
    def name(self) -> str:
        return self.caps.name

    def __str__(self) -> str:
        return self.caps.name

    def __eq__(self, other) -> bool:
        if isinstance(other, str):
            return self.caps.name == other
        return isinstance(other, Framework) and self.caps == other.caps

    def __hash__(self) -> int:
        return hash(self.caps)

    def with_caps(self, **changes) -> Framework:
        """The same framework run another way (a published run without an overlap it offers)."""
        return replace(self, caps=replace(self.caps, **changes))


def front_loaded(layers: int, pp: int, v: int = 1) -> tuple[int, int, int] | None:
    """The split when none of the even ones fits (DeepSeek-V3's 61 layers over 4, 8 or 16 stages):
    every one of the pp·v (virtual) stages takes ceil(layers / pp) / v layers and the last one what
    is left, at least one (Megatron's --pipeline-model-parallel-layout, as Megatron-Bridge's
    DeepSeek-V3 recipes lay it out: recipes/deepseek/h100/deepseek_v3.py
    _get_deepseek_v3_pipeline_layout, e.g. 16+16+16+13 over 4). None when that leaves the last
    stage nothing, or v does not divide a rank's layers."""
    per_rank = -(-layers // pp)
    if per_rank % v:
        return None
    last = layers - (pp * v - 1) * (per_rank // v)
    if last < 1:
        return None
    return per_rank, per_rank, per_rank - per_rank // v + last


def even_split(layers: int, pp: int) -> bool:
    """Whether `layers` split over pp stages without a layout: evenly, or with the first and/or
    last stage one layer short (the splits Megatron's --account-for-*-in-pipeline-split make)."""
    return pp == 1 or (pp <= layers and any((layers + extra) % pp == 0 for extra in (0, 1, 2) if extra < 2 or pp > 2))


def common_problems(caps: Capabilities, plan: Any, w: Any) -> list[str]:
    """What a capability table alone refuses (each framework adds its own rules)."""
    out = []
    name = caps.name
    if plan.tp > 1 and not caps.tp:
        out.append(f"{name} has no tensor parallelism (tp={plan.tp})")
    if plan.pp > 1 and not caps.pp:
        out.append(f"{name} has no pipeline parallelism (pp={plan.pp})")
    if plan.cp > 1 and not caps.cp:
        out.append(f"{name} has no context parallelism (cp={plan.cp})")
    if plan.sequence_parallel and plan.tp > 1 and caps.sequence_parallel == "no":
        out.append(f"{name} has no sequence parallelism")
    if getattr(plan, "virtual_stages", 1) > 1 and not caps.interleaved:
        out.append(f"{name} has no interleaved pipeline schedule (virtual_stages={plan.virtual_stages})")
    for what, value in (("sharding", plan.sharding), ("recompute", plan.recompute), ("offload", plan.offload)):
        if not caps.offers(what, value):
            table = {"sharding": caps.shardings, "recompute": caps.recompute, "offload": caps.offload}[what]
            out.append(f"{name} does not run {what}={value} (it offers {', '.join(table)})")
    if getattr(plan, "recompute_layers", 0) and not caps.recompute_layers:
        out.append(f"{name} cannot recompute only {plan.recompute_layers} layers per stage (it recomputes all or none)")
    if w.optimizer not in caps.optimizers:
        out.append(f"{name} has no {w.optimizer} optimizer (it offers {', '.join(caps.optimizers)})")
    if w.method not in caps.methods:
        out.append(f"{name} does not train with method {w.method} (it offers {', '.join(caps.methods)})")
    if w.precision not in caps.precisions:
        why = f": {caps.low_precision_note}" if caps.low_precision_note and w.precision in LOW_PRECISIONS else ""
        out.append(f"{name} does not train in {w.precision} (it offers {', '.join(caps.precisions)}){why}")
    return out


def default_fp8_recipe(caps: Capabilities, asked: str | None) -> str:
    """train.fp8_recipe, or the framework's default scaling when the recipe leaves it out."""
    return asked or caps.fp8_recipes[0]


def fp8_param_gather(caps: Capabilities, precision: str, fp8_recipe: str, sharding: str) -> bool:
    """The layers' weights live in FP8 only (Megatron's --fp8-param-gather: Transformer Engine's
    fp8_model_init builds them as FP8 tensors; the distributed optimizer keeps the fp32 master and
    all-gathers the updated weights in FP8), as Megatron-Bridge's FP8-CS and MXFP8 perf recipes
    run (perf_recipes/llama/*: fp8_param_gather=True) for per-tensor and MXFP8 scaling."""
    return caps.fp8_param_gather and sharding == "zero1" and (
        precision == "mxfp8" or (precision == "fp8" and fp8_recipe in ("tensorwise", "delayed")))


def loss_chunks(w, pp: int) -> int:
    """Sequence chunks the plan's loss runs in (caps.loss_chunks), 0 for one piece. Not under
    pipeline parallelism, whose last stage's chunked loss inside the schedule is not traced (the
    whole logits are counted there: an over-estimate), nor with the recipe's own fused loss."""
    return w.caps.loss_chunks if pp == 1 and not w.fused_cross_entropy else 0


def ep_overlap(w, plan) -> bool:
    """The plan runs Megatron-Core's combined 1F1B schedule, each layer's forward of one
    micro-batch beside its mirror layer's backward of the previous one, so that one's dispatch
    and combine all-to-alls run under the other's compute (caps.ep_overlap). Turned on wherever
    megatron-core's TransformerConfig accepts it (transformer_config.py __post_init__,
    core_v0.16.1): expert parallelism, no full recompute, virtual stages when pipelined, a 16-bit
    model (FP8 trains a BF16 one), at most one MTP module and then pipelined; not where the recipe
    turns it off (train.ep_overlap: false). w: a Workload (duck-typed: the planner's layer is above
    this one)."""
    mtp = w.mtp_layers
    return (w.caps.ep_overlap and w.ep_overlap is not False and w.model.moe is not None and plan.ep > 1
            and plan.recompute != "full"
            and (plan.pp == 1 or plan.virtual_stages > 1) and w.precision != "fp32"
            and (mtp == 0 or (mtp == 1 and plan.pp > 1)))


def recompute_modules(w) -> tuple[str, ...]:
    """The submodules "selective" recomputes under a framework that names them (Megatron-Core's
    --recompute-modules): the recipe's (train.recompute_modules), else the cheap ones that free
    the most: MLA's up-projection (its q, k, v are a quarter of a DeepSeek-V3 layer's
    activations, for two small GEMMs) and the experts' SwiGLU in 16-bit (under FP8 fc2 keeps its
    quantised input anyway), as Megatron-Bridge's DeepSeek-V3 and gpt-oss recipes pick them, and
    the attention core under eager attention; Megatron's default, the attention core, where none
    of those applies. () for a framework without named modules. w: a Workload (duck-typed)."""
    if not w.caps.recompute_modules:
        return ()
    if w.recompute_modules:
        return tuple(w.recompute_modules)
    m = w.model
    auto = (("mla_up_proj",) if m.mla is not None else ()) + \
        (("moe_act",) if m.moe is not None and w.precision not in LOW_PRECISIONS else ()) + \
        (("core_attn",) if w.attention == "eager" else ())
    return auto or ("core_attn",)


def data_parallel_overlaps(plan) -> tuple[str, ...]:
    """What runs under the compute without a flag (the plan lists it; planner/perf.py
    _data_parallel counts on it): FSDP2 issues each layer's all-gather on its own stream a layer
    ahead (implicit prefetching) and its reduce-scatter under the backward; DDP all-reduces its
    buckets as the backward fills them (torch distributed/fsdp/_fully_shard, nn/parallel/distributed.py)."""
    if plan.dp * plan.cp <= 1:
        return ()
    if plan.sharding in ("zero3", "hsdp"):
        return ("FSDP prefetch (all-gathers under the previous layer, reduce-scatters under the backward)",)
    return ("grad reduce (DDP's buckets all-reduced under the backward)",)


def selective_frees_memory(w) -> bool:
    """Whether "selective" recomputation holds less than none here, so that the search and the
    ladder try it: under eager attention (the a·s² scores go), torchtitan's op-level SAC, or
    Megatron's named modules beyond the attention core (recompute_modules: MLA's up-projection,
    the experts' SwiGLU). The attention core alone frees nothing under flash attention, which
    keeps no scores. w: a Workload (duck-typed)."""
    if "selective" not in w.caps.recompute:
        return False
    return w.attention == "eager" or w.caps.selective is Selective.OP_SAC or \
        bool(set(recompute_modules(w)) - {"core_attn"})


def flex_backend(w, plan) -> str | None:
    """The DeepEP kernels the plan's experts are reached through, "hybridep" or "deepep", or None
    (NCCL's all-to-alls). Megatron-Core's --moe-token-dispatcher-type flex with
    --moe-flex-dispatcher-backend hybridep (token_dispatcher.py _HybridEPManager) or deepep
    (_DeepepManager): each token goes once to its peer GPU in every other NVLink domain (HybridEP)
    or 8-GPU node (DeepEP's normal internode kernels) its experts are in and is fanned out there
    over NVLink (DeepEP docs/Hybrid-EP_Implementation.md, "RDMA communication pattern"; DeepEP's
    README, normal kernels). w: a Workload (duck-typed, as ep_overlap)."""
    if w.moe_dispatcher in ("hybridep", "deepep") and w.model.moe is not None and plan.ep > 1:
        return w.moe_dispatcher
    return None


def graphed_step(w, plan) -> bool:
    """The plan's forward and backward run as one CUDA graph (caps.cuda_graphs): torchtitan's
    default, unless the recipe turns it off (train.cuda_graphs: false); jobctl renders it off under
    pipeline and expert parallelism, where torchtitan cannot capture one."""
    return w.caps.cuda_graphs and w.cuda_graphs is not False and plan.pp == 1 and plan.ep == 1
