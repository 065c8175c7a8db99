"""The memory model against measurements of real PyTorch models on CPU (docs/memory-model.md §6).

jobctl_measure/torch_reference.py builds tiny Llama- and GPT-style models the way the frameworks do
(eager Hugging Face-style layers, or fused-kernel layers), runs a real training step and
sums the tensors: parameters, gradients and optimizer states must match exactly; the bytes
autograd saves for backward (deduplicated by storage) within 10%.
"""

import pytest

torch = pytest.importorskip("torch")

from jobctl_measure import torch_reference as tr  # noqa: E402

from jobctl.planner.memory import (  # noqa: E402
    Workload,
    _stage_matrices,
    layer_activation_bytes,
    optimizer_state_elements,
    state_bytes,
    stored_layer_bytes,
)
from jobctl.planner.models import ModelSpec  # noqa: E402
from jobctl.planner.plan import Plan  # noqa: E402

LLAMA_SHAPES = [
    dict(layers=2, hidden=128, ffn_hidden=344, heads=4, kv_heads=2, vocab=300),
    dict(layers=3, hidden=256, ffn_hidden=688, heads=8, kv_heads=2, vocab=1000),
    dict(layers=2, hidden=192, ffn_hidden=512, heads=6, kv_heads=6, vocab=500, tied_embeddings=True),
]
GPT_SHAPES = [
    dict(layers=2, hidden=128, ffn_hidden=512, heads=4, vocab=300, max_seq_len=256),
    dict(layers=2, hidden=256, ffn_hidden=1024, heads=8, vocab=1000, max_seq_len=512),
]


def spec(family, shape):
    return ModelSpec(name="tiny", family=family, layers=shape["layers"], hidden=shape["hidden"],
                     ffn_hidden=shape["ffn_hidden"], heads=shape["heads"], kv_heads=shape.get("kv_heads", shape["heads"]),
                     vocab=shape["vocab"], tied_embeddings=shape.get("tied_embeddings", family == "gpt"),
                     max_seq_len=shape.get("max_seq_len", 0), dropout=shape.get("dropout", 0.0))


def one_gpu(recompute="none", b=1):
    return Plan(1, 1, 1, 1, 1, 1, "none", b, 1, b, recompute, "none", False)


def cfg_of(family, shape, **kw):
    c = dict(shape, family=family, tied_embeddings=shape.get("tied_embeddings", family == "gpt"))
    c.update(kw)
    return c


@pytest.mark.parametrize("family,shape", [("llama", s) for s in LLAMA_SHAPES] + [("gpt", s) for s in GPT_SHAPES])
@pytest.mark.parametrize("optimizer,precision,dtype", [
    ("adamw", "fp32", "float32"), ("adamw", "bf16-pure", "bfloat16"),
    ("sgd-momentum", "fp32", "float32"), ("adafactor", "fp32", "float32"),
])
def test_model_states_exact(family, shape, optimizer, precision, dtype):
    cfg = cfg_of(family, shape)
    measured = tr.state_bytes(cfg, optimizer=optimizer, dtype=getattr(torch, dtype))
    m = spec(family, shape)
    assert measured["params"] == m.params()
    sb = state_bytes("generic", precision, optimizer)
    assert measured["param_bytes"] == m.params() * sb.weight
    assert measured["grad_bytes"] == m.params() * sb.grad
    w = Workload(m, 8, 1, optimizer=optimizer, precision=precision)
    elems = optimizer_state_elements(optimizer, _stage_matrices(w, one_gpu(), "only"))
    assert measured["optimizer_bytes"] == elems * sb.state_elem


CASES = (
    [("llama", s, "generic", dict(impl="eager"), "sdpa") for s in LLAMA_SHAPES]
    + [("llama", s, "torchtitan", dict(impl="fused"), "sdpa") for s in LLAMA_SHAPES]
    + [("gpt", dict(s, dropout=0.1), "generic", dict(attention="eager"), "eager") for s in GPT_SHAPES]
    + [("gpt", s, "generic", dict(attention="sdpa"), "sdpa") for s in GPT_SHAPES]
)


@pytest.mark.parametrize("family,shape,framework,impl,attention", CASES)
@pytest.mark.parametrize("seq,batch", [(128, 2), (256, 1)])
@pytest.mark.parametrize("recompute", ["none", "full"])
def test_saved_activations_within_10_percent(family, shape, framework, impl, attention, seq, batch, recompute):
    cfg = cfg_of(family, shape, **impl)
    measured = tr.saved_activation_bytes(cfg, seq, batch, recompute=recompute, attribute=False)
    w = Workload(spec(family, shape), seq, batch, precision="bf16-pure", attention=attention, framework=framework)
    p = one_gpu(recompute, batch)
    predicted = stored_layer_bytes(w, p, batch)
    for layer_bytes in measured["per_layer"]:
        assert layer_bytes == pytest.approx(predicted, rel=0.10), (layer_bytes, predicted)
    if recompute == "none":
        assert predicted == pytest.approx(layer_activation_bytes(w, p, batch))
