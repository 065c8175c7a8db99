"""Test-only stand-in for torchtitan's trainer (tests/test_real_trainers_torchtitan.py): loads the
run's config with torchtitan's own ConfigManager from the argv jobctl rendered, as
torchtitan.train does first, and reports what it built; it trains nothing. This machine has no
GPU: the Float8 converter's capability probe answers for the H100 the plan is for."""

import sys
import warnings

warnings.filterwarnings("ignore")
import torchtitan.components.quantization.float8 as tt_float8  # noqa: E402
from torchtitan.config import ConfigManager  # noqa: E402
from torchtitan.models.common.linear import Linear  # noqa: E402

tt_float8.has_cuda_capability = lambda major, minor: True
cfg = ConfigManager().parse_args(sys.argv[1:])
kinds = [type(lc).__qualname__ for _fqn, lc, _p, _a in cfg.model_spec.model.traverse(Linear.Config)]
print(f"tt_load_config: module {type(cfg).__module__} float8 linears {kinds.count('Float8Linear.Config')} "
      f"other linears {len(kinds) - kinds.count('Float8Linear.Config')}", flush=True)
