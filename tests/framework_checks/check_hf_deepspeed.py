"""Hugging Face Trainer with DeepSpeed: the rendered `hf_args` parsed by transformers'
HfArgumentParser into TrainingArguments, then the rendered ds_config.json run through
HfTrainerDeepSpeedConfig's own consistency checks (transformers/integrations/deepspeed.py:
trainer_config_process and trainer_config_finalize compare batch, accumulation, clipping, lr,
Adam betas/eps, weight decay, bf16/fp16, scheduler steps and warm-up with the Trainer's flags and
refuse any mismatch).

Two stand-ins, both for this CPU-only machine: `--use_cpu` is added (TrainingArguments refuses
--bf16 without a GPU otherwise), and the Trainer's world size is answered with the plan's
data-parallel size (what torchrun would give it) instead of the single process running here."""

import json
import os
import sys
import tempfile
import warnings

warnings.filterwarnings("ignore")
from transformers import HfArgumentParser, TrainingArguments  # noqa: E402
from transformers.integrations.deepspeed import HfTrainerDeepSpeedConfig  # noqa: E402


class AtWorldSize:
    """TrainingArguments as the Trainer sees them on `world` ranks."""

    def __init__(self, args, world):
        self._args, self.world_size = args, world

    def __getattr__(self, name):
        return getattr(self._args, name)


def check(case):
    fw = case["framework"]
    with tempfile.TemporaryDirectory() as tmp:
        for name, text in fw["files"].items():
            with open(os.path.join(tmp, name), "w") as f:
                f.write(text)
        argv = [a.replace("{JOBCTL_JOB_FOLDER}/framework", tmp) for a in fw["hf_args"]]
        (args,) = HfArgumentParser(TrainingArguments).parse_args_into_dataclasses(
            argv + ["--output_dir", tmp, "--use_cpu"])
        hf = HfTrainerDeepSpeedConfig(os.path.join(tmp, "ds_config.json"))
        seen = AtWorldSize(args, case["plan"]["dp"])
        hf.trainer_config_process(seen)
        hf.trainer_config_finalize(seen, None, args.max_steps)
    return {"ok": True, "micro": args.per_device_train_batch_size, "accum": args.gradient_accumulation_steps,
            "bf16": args.bf16, "lr": args.learning_rate, "max_steps": args.max_steps,
            "gradient_checkpointing": args.gradient_checkpointing}


out = []
for case in json.load(sys.stdin):
    try:
        out.append(check(case))
    except BaseException as e:  # argparse exits with SystemExit on an unknown flag
        out.append({"ok": False, "error": f"{type(e).__name__}: {e}"})
print(json.dumps(out))
