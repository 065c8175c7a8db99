"""Fuzz the recipe and inventory loaders under a memory limit (run by tests/test_hostile_input.py
in a child process, so that the limit cannot touch the test runner).

Every generated file must end in a loaded document or a ConfigError (exit code 2 at the CLI);
any other exception, a MemoryError included, fails. Prints the number of examples run."""

import resource
import sys
import tempfile
from pathlib import Path

LIMIT = int(sys.argv[1]) if len(sys.argv) > 1 else 2 << 30
EXAMPLES = int(sys.argv[2]) if len(sys.argv) > 2 else 150
resource.setrlimit(resource.RLIMIT_AS, (LIMIT, LIMIT))

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from jobctl.errors import ConfigError
from jobctl.planning import load_inventory, load_recipe

KEYS = ["name", "model", "train", "seq_len", "global_batch_size", "parallelism", "tp", "launch", "command",
        "partitions", "gpu", "nodes", "gpus_per_node", "base", "framework", "supports", "lr", "env", "<<"]
SCALARS = st.one_of(st.integers(-2**70, 2**70), st.floats(allow_nan=True), st.booleans(), st.none(),
                    st.text(max_size=20), st.sampled_from(["${train.seq_len}", "${a}", "${oc.env:HOME}", "???", ".inf",
                                                           "*a", "&a x", "llama3.1-8b", "h100-sxm-80gb", "\x1b[31m"]))


def documents():
    """YAML text: a recipe- or inventory-shaped tree with anchors, aliases, nesting, and noise."""
    tree = st.recursive(SCALARS, lambda kids: st.one_of(st.lists(kids, max_size=4),
                                                        st.dictionaries(st.sampled_from(KEYS), kids, max_size=5)),
                        max_leaves=30)
    import yaml

    def render(doc, anchors, noise, cut):
        try:
            text = yaml.safe_dump(doc if isinstance(doc, dict) else {"name": doc}, default_flow_style=anchors % 2 == 0)
        except Exception:
            text = "name: x\n"
        if anchors:  # aliases of aliases: the billion-laughs shape, at a random width
            text += "l0: &l0 [" + ", ".join(["lol"] * anchors) + "]\n"
            for i in range(1, anchors):
                text += f"l{i}: &l{i} [" + ", ".join([f"*l{i - 1}"] * anchors) + "]\n"
        if noise:
            text += noise
        return text[:cut] if cut else text

    return st.builds(render, tree, st.integers(0, 9), st.text(max_size=40), st.integers(0, 400))


@settings(max_examples=EXAMPLES, deadline=None, database=None,
          suppress_health_check=list(HealthCheck))
@given(text=documents(), kind=st.sampled_from(["recipe", "inventory"]))
def fuzz(text, kind):
    with tempfile.TemporaryDirectory() as d:
        path = Path(d) / f"{kind}.yaml"
        path.write_text(text)
        try:
            (load_recipe if kind == "recipe" else load_inventory)(str(path), [])
        except ConfigError as e:
            assert e.issues, "a ConfigError names at least one problem"


count = 0
_inner = fuzz.hypothesis.inner_test


def counted(**kw):
    global count
    count += 1
    return _inner(**kw)


fuzz.hypothesis.inner_test = counted
fuzz()
print(f"examples: {count}")
