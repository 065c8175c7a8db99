"""Run by Python at start-up when this folder is on PYTHONPATH: the stack-dump signal, and
jobctl's memory hooks when JOBCTL_HOOKS=1.

JOBCTL_STACK_SIGNAL=N (set by the job runner) registers faulthandler on signal N: every
thread's Python stack is printed to stderr when the runner's hang watchdog sends it
(jobctl/runtime/progress.py). A program that sets its own handler for N replaces it.

The job runner puts this folder first on PYTHONPATH (jobctl.runtime.hooks.site_env). Being first
hides any other sitecustomize (a distribution's, a virtual environment's), so that one is
found further along sys.path and run first. Nothing here may stop Python from starting.
"""

import os
import sys

_HERE = os.path.dirname(os.path.abspath(__file__))


def _run_next_sitecustomize() -> None:
    import importlib.machinery
    import importlib.util

    path = [p for p in sys.path if os.path.abspath(p or os.curdir) != _HERE]
    spec = importlib.machinery.PathFinder.find_spec("sitecustomize", path)
    if spec is None or spec.loader is None:
        return
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)


def _load_hooks():
    try:
        from jobctl.runtime import hooks
        return hooks
    except ImportError:
        pass
    # jobctl is not installed in the job's Python: hooks.py needs only the standard library
    # and torch, so load it by its path (a script cannot `import jobctl` here anyway).
    import importlib.util

    spec = importlib.util.spec_from_file_location(
        "_jobctl_hooks", os.path.join(os.path.dirname(_HERE), "hooks.py"))
    module = importlib.util.module_from_spec(spec)
    sys.modules["_jobctl_hooks"] = module
    spec.loader.exec_module(module)
    return module


try:
    _run_next_sitecustomize()
except Exception as e:
    print(f"jobctl.hooks: the next sitecustomize failed: {type(e).__name__}: {e}", file=sys.stderr)


def _register_stack_signal() -> None:
    value = os.environ.get("JOBCTL_STACK_SIGNAL", "")
    if not value.isdigit():
        return
    import faulthandler

    faulthandler.register(int(value), all_threads=True, chain=False)


try:
    _register_stack_signal()
except Exception as e:  # a signal this Python cannot register: no stacks, the job still runs
    print(f"jobctl: stack-dump signal not registered: {type(e).__name__}: {e}", file=sys.stderr)

if os.environ.get("JOBCTL_HOOKS") == "1":
    try:
        _load_hooks().site_install()
    except Exception as e:
        print(f"jobctl.hooks: not installed: {type(e).__name__}: {e}", file=sys.stderr)
