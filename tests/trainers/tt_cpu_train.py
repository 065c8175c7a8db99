"""TEST-ONLY: run torchtitan 0.3.0's own trainer (torchtitan.train.main) on CPU ranks with gloo.

Never use this for real training: it exists so that tests/test_real_trainers_tt_fsdp.py can run
the argv jobctl renders for torchtitan (`--parallelism.*`, `--training.*`, ..., the
`activation_checkpoint:` subcommand last) through torchtitan's real ConfigManager, Trainer,
parallelize/pipeline functions, FSDP2, DTensor TP, loss and optimizer on a machine without a
GPU. The recipe's command is

    python tests/trainers/tt_cpu_train.py --module llama3 --config llama3_debugmodel ${framework.args}

under jobctl's torchrun. What is patched, and why (each the minimum that was needed):

1. The device. torchtitan.tools.utils picks its device at import time with
   `torch._utils._get_available_device_type() or "cuda"`: on a CPU-only machine that is CUDA,
   and every module imports the result (`device_type`, `device_module`) by name. While that
   module is imported, the available device type is reported as "cpu" and its module as
   `_CpuDevice` below: torch.cpu plus the few memory/properties queries torchtitan's
   DeviceMemoryMonitor and set_pg_timeouts make (torch.cpu has no get_device_name,
   get_device_properties, memory_stats, reset_peak_memory_stats, empty_cache; its
   current_device() returns the string "cpu", which barrier(device_ids=[...]) cannot use).
   With device type "cpu", init_distributed picks gloo (Backend.default_device_backend_map).
2. `torch.distributed.set_timeout`: torchtitan 0.3.0 calls it after the first step
   (distributed/utils.py set_pg_timeouts); torch 2.13 does not have it (AttributeError). When
   it is absent it becomes a no-op: the timeout only matters for hung collectives.
3. Data. The registry config reads the tokenizer from ./tests/assets/tokenizer and the
   `c4_test` dataset from tests/assets/c4_test, which are in torchtitan's repository, not in
   its wheel. Unless the command gives them, a learnable synthetic corpus (documents that
   count up through a ring of words, so every next word is determined by the one before) and
   a word-level tokenizer for it (tokenizer.json + tokenizer_config.json, 2000 tokens < the
   debug model's 2048) are written to a temporary folder, and `--hf_assets_path` and
   `--dataloader.dataset_path` point there; torchtitan's own HuggingFaceTokenizer and
   HuggingFaceTextDataLoader read them. `--dump_folder` goes to the job folder
   (JOBCTL_JOB_FOLDER) or the temporary folder, so nothing is written under the working tree.
   These options are put before the first subcommand (tyro reads every option after
   `activation_checkpoint:...` as the subcommand's).
5. Gradient reduction. torchtitan sets FSDP2's gradient divide factor to 1 (it scales by the
   global token count itself; distributed/fsdp.py disable_fsdp_gradient_division), and FSDP2
   then reduce-scatters with ReduceOp.PREMUL_SUM(1/1) (fsdp/_fully_shard/_fsdp_collectives.py
   _get_gradient_divide_factors), which gloo does not have. Each FSDP module is also set to
   force SUM reductions: the same result, a sum multiplied by 1.
6. The SPMD backend. torchtitan 0.3.0's default `parallelism.spmd_backend` "spmd_types" hands
   fully_shard full-mesh DTensor parameters, and torch 2.13's FSDP2 refuses the plain norm
   weights the llama3 model leaves ("all parameters must be DTensors on the full SPMD mesh");
   unless the command says otherwise, `--parallelism.spmd_backend=partial_dtensor` (DTensor for
   the model-parallel axes only, torchtitan's other supported path) is added. jobctl states this
   skew (jobctl/frameworks/torchtitan.py).
7. Pipeline steps. torchtitan 0.3.0 splits the batch itself and calls
   `pp_schedule.step(arg_mbs=..., kwarg_mbs=..., target_mbs=...)` (trainer.py:857); torch
   2.13's schedules (pipelining/schedules.py, PipelineScheduleSingle/Multi.step) take the whole
   batch and split it, so they pass `arg_mbs` on to the model ("Decoder.forward() got an
   unexpected keyword argument 'arg_mbs'"). The step accepts the micro-batch lists and joins
   them back along the batch dimension for the schedule to split again into the same pieces.
   This skew is on GPUs too; jobctl states it (jobctl/frameworks/torchtitan.py).
4. Attention. llama3_debugmodel uses FlexAttention, which torchtitan runs through
   torch.compile (inductor) for its kernel and its block masks; on a 2-core CPU that compiles
   C++ for minutes. JOBCTL_TT_SDPA=1 (the default here) swaps the registry config's inner
   attention for torchtitan's own ScaledDotProductAttention (causal, the same math) before the
   Trainer is built. JOBCTL_TT_SDPA=0 keeps FlexAttention.
"""

from __future__ import annotations

import json
import os
import sys
import tempfile
import types

import torch
import torch.distributed

RING = 1990  # words in the synthetic vocabulary; + 3 special tokens stays under the model's 2048
DOCS = 400  # documents in the synthetic corpus
DOC_WORDS = 200  # words per document


class _CpuDevice(types.ModuleType):
    """torch.cpu with the device queries torchtitan makes of torch.cuda (patch 1)."""

    def __init__(self):
        super().__init__("torchtitan_cpu_device")
        for name in dir(torch.cpu):
            if not name.startswith("__") and name not in type(self).__dict__:  # keep the overrides below
                setattr(self, name, getattr(torch.cpu, name))

    @staticmethod
    def current_device() -> int:
        return 0

    @staticmethod
    def get_device_name(device=None) -> str:
        return "cpu"

    @staticmethod
    def get_device_properties(device=None):
        total = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
        return types.SimpleNamespace(name="cpu", total_memory=total)

    @staticmethod
    def memory_stats(device=None) -> dict:
        return {}  # DeviceMemoryMonitor reads .get(key, -1)

    @staticmethod
    def reset_peak_memory_stats(device=None) -> None:
        pass

    @staticmethod
    def empty_cache() -> None:
        pass


def patch_device() -> None:
    """Patch 1: torchtitan.tools.utils decides its device as CPU."""
    import torch._utils as tu

    if "torchtitan.tools.utils" in sys.modules:
        raise RuntimeError("tt_cpu_train: torchtitan was imported before the CPU device patch")
    get_type, get_module = tu._get_available_device_type, tu._get_device_module
    cpu = _CpuDevice()
    tu._get_available_device_type = lambda: "cpu"
    tu._get_device_module = lambda device_type: cpu if device_type == "cpu" else get_module(device_type)
    try:
        import torchtitan.tools.utils as tt_utils
    finally:
        tu._get_available_device_type, tu._get_device_module = get_type, get_module
    assert tt_utils.device_type == "cpu" and tt_utils.device_module is cpu


def patch_set_timeout() -> None:
    """Patch 2: torch.distributed.set_timeout, absent in torch 2.13, as a no-op."""
    if not hasattr(torch.distributed, "set_timeout"):
        torch.distributed.set_timeout = lambda timeout, group=None: None


def patch_sdpa() -> None:
    """Patch 4: the registry configs' FlexAttention -> torchtitan's ScaledDotProductAttention."""
    import dataclasses

    from torchtitan.config import manager
    from torchtitan.models.common.attention import FlexAttention, ScaledDotProductAttention

    load = manager.ConfigManager._load_config

    def _load_config(self, args):
        config, rest = load(self, args)
        spec = getattr(config, "model_spec", None)
        if spec is not None:
            for layer in spec.model.layers:
                attn = layer.attention
                if isinstance(attn.inner_attention, FlexAttention.Config):
                    attn.inner_attention = ScaledDotProductAttention.Config()
            assert not any(True for _ in spec.model.traverse(FlexAttention.Config))
        return config, rest

    assert dataclasses.is_dataclass(ScaledDotProductAttention.Config)
    manager.ConfigManager._load_config = _load_config


def patch_gradient_reduction() -> None:
    """Patch 5: FSDP modules that torchtitan gives a divide factor reduce with SUM (gloo)."""
    from torch.distributed.fsdp import FSDPModule

    set_factor = FSDPModule.set_gradient_divide_factor

    def set_gradient_divide_factor(self, factor):
        set_factor(self, factor)
        self.set_force_sum_reduction_for_comms(True)

    FSDPModule.set_gradient_divide_factor = set_gradient_divide_factor


def patch_pipeline_step() -> None:
    """Patch 7: torch 2.13's schedules accept torchtitan 0.3.0's pre-split micro-batches."""
    from torch.distributed.pipelining import schedules

    def joined(step):
        def step_with_microbatches(self, *args, arg_mbs=None, kwarg_mbs=None, target_mbs=None, **kwargs):
            if arg_mbs:
                args = tuple(torch.cat(parts) for parts in zip(*arg_mbs))
            for key in (kwarg_mbs or [{}])[0]:
                values = [mb[key] for mb in kwarg_mbs]
                kwargs[key] = torch.cat(values) if isinstance(values[0], torch.Tensor) else values[0]
            if target_mbs:
                kwargs["target"] = torch.cat(target_mbs)
            return step(self, *args, **kwargs)
        return step_with_microbatches

    for cls in (schedules.PipelineScheduleSingle, schedules.PipelineScheduleMulti):
        cls.step = joined(cls.step)


def synthetic_assets(folder: str) -> tuple[str, str]:
    """Patch 3: a word-level tokenizer folder and a json dataset folder under `folder`."""
    from tokenizers import Tokenizer, pre_tokenizers
    from tokenizers.models import WordLevel

    specials = ["[UNK]", "<s>", "</s>"]
    vocab = {t: i for i, t in enumerate(specials + [f"w{i}" for i in range(RING)])}
    tok = Tokenizer(WordLevel(vocab=vocab, unk_token="[UNK]"))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    tok_dir = os.path.join(folder, "tokenizer")
    os.makedirs(tok_dir, exist_ok=True)
    tok.save(os.path.join(tok_dir, "tokenizer.json"))
    with open(os.path.join(tok_dir, "tokenizer_config.json"), "w") as f:
        json.dump({"bos_token": "<s>", "eos_token": "</s>", "unk_token": "[UNK]",
                   "add_bos_token": True, "add_eos_token": True}, f)
    data_dir = os.path.join(folder, "data")
    os.makedirs(data_dir, exist_ok=True)
    with open(os.path.join(data_dir, "train.jsonl"), "w") as f:
        for d in range(DOCS):
            start = (d * 7919) % RING  # a fixed, spread-out starting word per document
            text = " ".join(f"w{(start + i) % RING}" for i in range(DOC_WORDS))
            f.write(json.dumps({"text": text}) + "\n")
    return tok_dir, data_dir


def _given(argv: list[str], option: str) -> bool:
    return any(a == option or a.startswith(option + "=") for a in argv)


def with_defaults(argv: list[str], extra: list[str]) -> list[str]:
    """`extra` inserted before the first subcommand (`name:value`), options given in argv kept."""
    extra = [e for e in extra if not _given(argv, e.split("=", 1)[0])]
    at = next((i for i, a in enumerate(argv) if not a.startswith("-") and ":" in a), len(argv))
    return argv[:at] + extra + argv[at:]


def main(argv: list[str]) -> None:
    scratch = tempfile.mkdtemp(prefix=f"tt_cpu_rank{os.environ.get('RANK', '0')}_")
    os.environ.setdefault("HF_DATASETS_CACHE", os.path.join(scratch, "hf_datasets_cache"))
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    patch_device()
    patch_set_timeout()
    if os.environ.get("JOBCTL_TT_SDPA", "1") == "1":
        patch_sdpa()
    patch_gradient_reduction()
    patch_pipeline_step()
    extra = ["--parallelism.spmd_backend=partial_dtensor"]
    if not (_given(argv, "--hf_assets_path") and _given(argv, "--dataloader.dataset_path")):
        tok_dir, data_dir = synthetic_assets(scratch)
        extra += [f"--hf_assets_path={tok_dir}", f"--dataloader.dataset_path={data_dir}"]
    dump = os.path.join(os.environ["JOBCTL_JOB_FOLDER"], "torchtitan") if os.environ.get("JOBCTL_JOB_FOLDER") \
        else os.path.join(scratch, "outputs")
    extra += [f"--dump_folder={dump}"]
    sys.argv = [sys.argv[0]] + with_defaults(argv, extra)
    print("tt_cpu_train: argv " + json.dumps(sys.argv[1:]), flush=True)

    from torchtitan.train import main as torchtitan_main

    torchtitan_main()


if __name__ == "__main__":
    main(sys.argv[1:])
