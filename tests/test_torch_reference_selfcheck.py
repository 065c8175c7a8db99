"""Self-check of jobctl_measure/torch_reference.py (CPU, a few seconds)."""

import pytest

torch = pytest.importorskip("torch")

from jobctl_measure import torch_reference as tr  # noqa: E402

LLAMA = dict(family="llama", layers=2, hidden=64, ffn_hidden=160, heads=4, kv_heads=2, vocab=100,
             tied_embeddings=False)
GPT = dict(family="gpt", layers=2, hidden=64, ffn_hidden=256, heads=4, vocab=100, max_seq_len=32,
           tied_embeddings=True, dropout=0.1, attention="eager")


def _numel(model):
    return sum(p.numel() for p in model.parameters())


def test_param_count_llama_hand_formula():
    # L*(2h + h*h [q] + 2*h*(g*h/a) [k,v] + h*h [o] + 3*h*f) + V*h + h + V*h(untied)
    L, h, f, a, g, V = 2, 64, 160, 4, 2, 100
    hand = L * (2 * h + h * h + 2 * h * (g * h // a) + h * h + 3 * h * f) + V * h + h + V * h
    assert hand == 2 * (128 + 4096 + 4096 + 4096 + 30720) + 6400 + 64 + 6400
    for impl in ("eager", "fused"):
        cfg = dict(LLAMA, impl=impl)
        assert _numel(tr.build_model(cfg)) == hand
        assert tr.param_count_formula(cfg) == hand
    # tied: output head shares the embedding
    assert _numel(tr.build_model(dict(LLAMA, tied_embeddings=True))) == hand - V * h


def test_param_count_gpt_hand_formula():
    # V*h + P*h + L*(2*2h [LN] + 3h*h+3h [qkv] + h*h+h [proj] + h*f+f + f*h+h) + 2h [ln_f]
    L, h, f, V, P = 2, 64, 256, 100, 32
    hand = V * h + P * h + L * (4 * h + 3 * h * h + 3 * h + h * h + h + h * f + f + f * h + h) + 2 * h
    assert _numel(tr.build_model(GPT)) == hand
    assert tr.param_count_formula(GPT) == hand
    assert _numel(tr.build_model(dict(GPT, tied_embeddings=False))) == hand + V * h


def test_dedup_same_tensor_saved_twice_counts_once():
    x = torch.randn(1000, requires_grad=True)
    w = torch.nn.Parameter(torch.randn(1000))
    with tr.SavedTensorRecorder(exclude=[w]) as rec:
        y = x.exp()          # ExpBackward0 saves result y
        z = y * y            # MulBackward0 saves y twice
        v = y.view(10, 100)  # a view of y: same storage
        u = v.sin().sum() + (v * w.view(10, 100)).sum()  # Sin saves v; Mul saves v and param w
    assert len(rec.records) >= 5
    assert rec.total_bytes() == 1000 * 4  # only y's storage, once
    assert rec.excluded_bytes() == 1000 * 4  # w excluded
    rec.attribute_owners([z.sum() + u])
    owners = {o for r in rec.records for o in r["owners"]}
    assert {"ExpBackward0", "MulBackward0", "SinBackward0"} <= owners


def test_fused_rmsnorm_and_rope_backward():
    x = torch.randn(2, 3, 8, dtype=torch.float64, requires_grad=True)
    w = torch.randn(8, dtype=torch.float64, requires_grad=True)
    assert torch.autograd.gradcheck(lambda x, w: tr.RMSNormFunction.apply(x, w, 1e-6), (x, w))
    cos, sin = torch.randn(3, 1, 8, dtype=torch.float64), torch.randn(3, 1, 8, dtype=torch.float64)
    q = torch.randn(2, 3, 4, 8, dtype=torch.float64, requires_grad=True)
    assert torch.autograd.gradcheck(lambda q: tr.RotaryFunction.apply(q, cos, sin), (q,))


def test_fused_equals_eager_numerically():
    torch.manual_seed(0)
    eager = tr.build_model(dict(LLAMA, impl="eager"))
    fused = tr.build_model(dict(LLAMA, impl="fused"))
    fused.load_state_dict(eager.state_dict())
    ids = torch.randint(0, 100, (2, 12))
    outs = []
    for m in (eager, fused):
        loss = m(ids).float().logsumexp(-1).mean()
        loss.backward()
        outs.append((loss.detach(), [p.grad.clone() for p in m.parameters()]))
    torch.testing.assert_close(outs[0][0], outs[1][0], rtol=1e-5, atol=1e-5)
    for g0, g1 in zip(outs[0][1], outs[1][1]):
        torch.testing.assert_close(g0, g1, rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("cfg", [dict(LLAMA, impl="eager"), dict(LLAMA, impl="fused"), GPT,
                                 dict(GPT, attention="sdpa", dropout=0.0)])
def test_saved_activation_bytes_match_itemised_formula(cfg):
    s, b = 16, 2
    r = tr.saved_activation_bytes(cfg, s, b)
    exp = tr.expected_layer_bytes(cfg, s, b)["measured_model"]
    assert r["per_layer"] == [exp, exp]
    assert r["total"] == sum(r["per_layer"]) + r["head"] + r["embedding"] + r["other"]
    assert r["embedding"] == 8 * s * b  # int64 token ids saved by EmbeddingBackward0
    V = cfg["vocab"]
    assert r["head"] >= 4 * s * b * V  # fp32 log_softmax output
    rf = tr.saved_activation_bytes(cfg, s, b, recompute="full")
    assert rf["per_layer"] == [2 * s * b * cfg["hidden"]] * 2  # checkpoint keeps layer input
    assert rf["head"] == r["head"] and rf["embedding"] == r["embedding"]


def test_state_bytes_adamw_and_sgd():
    r = tr.state_bytes(LLAMA, "adamw", torch.float32)
    n = tr.param_count_formula(LLAMA)
    assert r["params"] == n
    assert r["param_bytes"] == r["grad_bytes"] == 4 * n
    assert r["optimizer_bytes"] == 8 * n
    n_tensors = len(list(tr.build_model(LLAMA).parameters()))
    assert r["optimizer_step_bytes"] == 4 * n_tensors  # fp32 scalar 'step' per param tensor
    rb = tr.state_bytes(LLAMA, "sgd-momentum", torch.bfloat16)
    assert rb["param_bytes"] == rb["grad_bytes"] == rb["optimizer_bytes"] == 2 * n
    assert tr.state_bytes(LLAMA, "sgd", torch.bfloat16)["optimizer_bytes"] == 0
