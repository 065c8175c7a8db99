"""The memory hooks' public name for training scripts: `from jobctl import hooks` (docs/hooks.md).

The implementation is jobctl.runtime.hooks; this module is that very module under its public name.
"""

import sys

from jobctl.runtime import hooks as _hooks

sys.modules[__name__] = _hooks
