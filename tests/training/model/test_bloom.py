import copy
import math
from pathlib import Path

import pytest
import torch

from training.config import ModelConfig
from training.model.bloom import Bloom, KVCache, alibi_slopes, attention_bias, segment_ids_from_offsets


def tiny(**kw) -> ModelConfig:
    return ModelConfig(
        **{"vocab_size": 100, "hidden_size": 32, "num_layers": 2, "num_heads": 4, "seq_len": 64, "init_std": 0.02, **kw}
    )


def tiny_model(seed: int = 0, **kw) -> Bloom:
    torch.manual_seed(seed)
    return Bloom(tiny(**kw)).eval()


def reference_slopes(n: int) -> list[float]:
    """BLOOM paper / Press et al.: 2^(-8i/n) for a power of two n, else the closest power of two's
    slopes plus every other slope of twice that many heads."""

    def power_of_2(m):
        return [2 ** (-8 * i / m) for i in range(1, m + 1)]

    c = 2 ** int(math.log2(n))
    return power_of_2(c) + power_of_2(2 * c)[0::2][: n - c]


@pytest.mark.parametrize("n", [4, 8, 12, 112])
def test_alibi_slopes_match_bloom_formula(n):
    got = alibi_slopes(n)
    assert got.shape == (n,) and got.dtype == torch.float32
    torch.testing.assert_close(got, torch.tensor(reference_slopes(n), dtype=torch.float32), rtol=1e-6, atol=0)


def test_segment_ids_from_offsets():
    seg = segment_ids_from_offsets([[0, 3], [0]], [5, 2], T=7)
    assert seg.tolist() == [[1, 1, 1, 2, 2, 0, 0], [1, 1, 0, 0, 0, 0, 0]]
    with pytest.raises(ValueError):
        segment_ids_from_offsets([[0, 5]], [5], T=7)  # an offset at the length: an empty document


def test_attention_bias_matches_naive_loops():
    # one row: doc 1 = positions 0-2, doc 2 = positions 3-5, padding 6-7
    seg = segment_ids_from_offsets([[0, 3]], [6], T=8)
    slopes = alibi_slopes(4)
    bias = attention_bias(seg, slopes, torch.float32)
    neg = torch.finfo(torch.float32).min
    assert bias.shape == (1, 4, 8, 8)
    for h in range(4):
        for i in range(8):
            for j in range(8):
                same_doc = seg[0, i] == seg[0, j] != 0
                if (j <= i and same_doc) or i == j:
                    want = -slopes[h].item() * (i - j)
                else:
                    want = neg
                assert bias[0, h, i, j].item() == pytest.approx(want, rel=1e-6, abs=0), (h, i, j)
    # no row is fully masked, so softmax stays finite (padding rows included)
    assert torch.isfinite(torch.softmax(bias, dim=-1)).all()


def test_one_bias_per_forward_and_a_new_one_when_its_inputs_change(monkeypatch):
    """Every layer of a forward shares one bias; an in-place edit of the segment ids, other
    slopes, another dtype or other tensors with the same values get a bias of their own."""
    seg = segment_ids_from_offsets([[0, 3]], [6], T=8)
    slopes = alibi_slopes(4)
    first = attention_bias(seg, slopes, torch.float32)
    assert attention_bias(seg, slopes, torch.float32) is first
    assert attention_bias(seg.clone(), slopes, torch.float32) is not first  # equal values, another tensor
    assert attention_bias(seg, slopes, torch.bfloat16).dtype == torch.bfloat16
    seg[0, 5] = 0  # in place: position 5 becomes padding
    edited = attention_bias(seg, slopes, torch.float32)
    assert edited[0, 0, 5, 4] == torch.finfo(torch.float32).min and first[0, 0, 5, 4] != edited[0, 0, 5, 4]
    half = attention_bias(seg, slopes[:2], torch.float32)
    assert half.shape == (1, 2, 8, 8)
    # a whole model's forward builds it once, not once per block
    model = tiny_model()
    import training.model.bloom as bloom

    built, real = [], bloom._attention_bias
    monkeypatch.setattr(bloom, "_attention_bias", lambda *a: built.append(1) or real(*a))
    model(torch.randint(0, 100, (1, 8)), seg)
    assert len(built) == 1 and len(model.blocks) > 1


def test_packed_documents_do_not_leak():
    model = tiny_model()
    T = 16
    g = torch.Generator().manual_seed(1)
    doc1, doc2 = torch.randint(0, 100, (5,), generator=g), torch.randint(0, 100, (7,), generator=g)
    pad = torch.zeros(T - 12, dtype=torch.long)

    packed = torch.cat([doc1, doc2, pad])[None]
    packed_seg = segment_ids_from_offsets([[0, 5]], [12], T)
    alone = torch.cat([doc2, torch.zeros(T - 7, dtype=torch.long)])[None]
    alone_seg = segment_ids_from_offsets([[0]], [7], T)

    with torch.no_grad():
        lp = model(packed, packed_seg)
        la = model(alone, alone_seg)
    assert torch.isfinite(lp).all()  # padding rows too
    torch.testing.assert_close(lp[0, 5:12], la[0, :7], rtol=1e-5, atol=1e-5)


def test_causal():
    model = tiny_model()
    ids = torch.randint(0, 100, (2, 12), generator=torch.Generator().manual_seed(2))
    changed = ids.clone()
    changed[:, 7] = (changed[:, 7] + 1) % 100
    with torch.no_grad():
        a, b = model(ids), model(changed)
    torch.testing.assert_close(a[:, :7], b[:, :7], rtol=0, atol=0)
    assert not torch.allclose(a[:, 7:], b[:, 7:])  # the change is seen from its own position on


def test_a_kv_cache_fed_a_prompt_then_token_by_token_gives_the_full_forwards_logits():
    """Generation's path (eval/generate.py): a prompt chunk into fresh caches, then one position at
    a time, each attending to the cached keys. A left-padded row (segment 0) as generate pads
    them: its padding is never attended to, and ALiBi's distances are the full sequence's."""
    model = tiny_model(seed=5)
    ids = torch.randint(0, 100, (2, 11), generator=torch.Generator().manual_seed(5))
    seg = torch.ones_like(ids)
    seg[1, :3] = 0  # row 1: a prompt of 2 tokens after 3 of padding
    with torch.no_grad():
        full = model(ids, seg)
        caches = {f"blocks.{i}": KVCache() for i in range(model.cfg.num_layers)}
        parts = [model(ids[:, :5], seg[:, :5], caches)]
        parts += [model(ids[:, t : t + 1], seg[:, t : t + 1], caches) for t in range(5, 11)]
    assert caches["blocks.0"].k.shape[2] == 11  # every position cached, none dropped
    torch.testing.assert_close(torch.cat(parts, 1), full, rtol=1e-5, atol=1e-5)


def test_tied_embeddings():
    model = tiny_model(vocab_size=200)  # padded to 256: no other weight has the embedding's shape (fc1 is 128×32)
    W = model.embedding.word_embeddings.weight
    assert W.shape == (model.cfg.padded_vocab(), 32) == (256, 32)
    # the only [V, H] matrix is the embedding: no separate output layer
    assert [n for n, p in model.named_parameters() if p.shape == W.shape] == ["embedding.word_embeddings.weight"]

    ids = torch.randint(
        0, 50, (2, 10), generator=torch.Generator().manual_seed(3)
    )  # ids < 50: rows 50.. unused on input
    x = (ids, torch.ones_like(ids))
    for _, layer in model.layers():
        x = layer(x)
    logits = model(ids)
    torch.testing.assert_close(logits[..., :200], (x[0] @ W.T)[..., :200])

    # gradient reaches W through the output projection: real rows never looked up get gradient
    model.loss(logits, ids).backward()
    assert W.grad[50:200].abs().sum() > 0
    # ... and through the lookup: with the projection cut off from W, the used rows still get gradient
    model.zero_grad()
    hidden = model.final_ln(model.embed_ln(model.embedding((ids, torch.ones_like(ids)))))[0]
    model.loss(torch.nn.functional.linear(hidden, W.detach()), ids).backward()
    assert W.grad[ids.unique()].abs().sum(dim=1).gt(0).all() and W.grad[50:].abs().sum() == 0


def test_layers_are_the_model_and_init_is_by_name():
    """forward runs exactly layers() then the tied projection; the same seed gives the same
    weights whatever else is built, another seed other weights; padding rows start at zero."""
    from training.model.bloom import init_weights

    a, b, c = Bloom(tiny(), seed=3), Bloom(tiny(), seed=3), Bloom(tiny(), seed=4)
    assert [n for n, _ in a.layers()] == ["embedding", "embed_ln", "blocks.0", "blocks.1", "final_ln"]
    assert all(torch.equal(p, q) for p, q in zip(a.parameters(), b.parameters()))
    assert not torch.equal(a.blocks[1].attn.qkv.weight, c.blocks[1].attn.qkv.weight)
    assert a.embedding.word_embeddings.weight[100:].abs().sum() == 0
    lone = Block_of(tiny())
    init_weights(lone, "blocks.1.", tiny(), seed=3)  # one block alone, as a pipeline stage builds it
    assert all(torch.equal(p, q) for p, q in zip(lone.parameters(), a.blocks[1].parameters()))
    with torch.device("meta"):
        m = Bloom(tiny())
    assert m.embedding.word_embeddings.weight.is_meta  # nothing allocated


def Block_of(cfg):
    from training.model.bloom import Block

    return Block(cfg)


def test_bloom_560m_parameter_count_and_flops():
    from pathlib import Path

    from bloomline.config import load_config

    cfg = load_config(ModelConfig, Path(__file__).resolve().parents[3] / "configs/model/bloom-560m.yaml")
    assert cfg.vocab_size == 250_680 and cfg.padded_vocab() == 250_880
    with torch.device("meta"):
        model = Bloom(cfg)
    assert model.num_params() == 559_214_592  # bigscience/bloom-560m
    # Megatron-LM (Narayanan et al. 2021, §5.1), without recomputation, per token:
    # 72·L·h² + 12·L·h·s + 6·V·h; ours differs only by the biases and LayerNorms
    L, h, s, V = 24, 1024, 2048, 250_880
    megatron = 72 * L * h**2 + 12 * L * h * s + 6 * V * h
    assert model.flops_per_token(s) == pytest.approx(megatron, rel=1e-3)
    assert model.flops_per_token(s) > model.flops_per_token(1024)


def test_trains_and_runs_in_bf16():
    model = tiny_model().train()
    ids = torch.randint(0, 100, (4, 16), generator=torch.Generator().manual_seed(4))
    seg = segment_ids_from_offsets([[0, 6], [0], [0, 3, 9], [0]], [16, 12, 16, 16], 16)
    labels = torch.where(seg > 0, ids.roll(-1, dims=1), -100)  # pad positions ignored
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    losses = []
    for _ in range(8):
        loss = model.loss(model(ids, seg), labels)
        opt.zero_grad()
        loss.backward()
        opt.step()
        losses.append(loss.item())
    # near uniform over the 100 real tokens at init: the 28 padding rows get no probability
    assert losses[0] == pytest.approx(math.log(100), rel=0.01)
    assert losses[-1] < 0.7 * losses[0] and all(a > b for a, b in zip(losses, losses[1:]))

    model.eval()
    with torch.no_grad(), torch.autocast("cpu", dtype=torch.bfloat16):
        logits = model(ids, seg)
    assert logits.dtype == torch.bfloat16 and torch.isfinite(logits).all()
    with torch.no_grad():
        ref = model(ids, seg)
    assert model.loss(logits, labels).item() == pytest.approx(model.loss(ref, labels).item(), rel=0.05)


def test_ignore_index_excluded_from_mean():
    logits = torch.randn(1, 3, 5)
    labels = torch.tensor([[1, -100, 2]])
    want = torch.nn.functional.cross_entropy(logits[0, [0, 2]], torch.tensor([1, 2]))
    torch.testing.assert_close(Bloom.loss(logits, labels), want)


def test_attention_splits_into_whole_heads_by_qkv_rows():
    """What a TP=2 wrapper will do: each rank takes a contiguous half of the qkv rows (and of the
    slopes) and of dense's input columns; the ranks' partial outputs sum to the full attention."""
    model = tiny_model()
    attn = model.blocks[0].attn
    x = torch.randn(2, 10, 32, generator=torch.Generator().manual_seed(5))
    seg = segment_ids_from_offsets([[0, 4], [0]], [10, 7], 10)
    with torch.no_grad():
        full = attn(x, seg)
        parts = []
        for r in range(2):
            shard = copy.deepcopy(attn)
            shard.qkv.weight.data = attn.qkv.weight[r * 48 : (r + 1) * 48].clone()
            shard.qkv.bias.data = attn.qkv.bias[r * 48 : (r + 1) * 48].clone()
            shard.dense.weight.data = attn.dense.weight[:, r * 16 : (r + 1) * 16].clone()
            shard.dense.bias.data = attn.dense.bias / 2  # the row-parallel bias is added once, after the sum
            shard.first_head = 2 * r
            assert shard.num_heads == 2
            parts.append(shard(x, seg))
    torch.testing.assert_close(parts[0] + parts[1], full, rtol=1e-5, atol=1e-6)


def test_padding_columns_of_the_vocabulary_are_inert():
    """Ids >= vocab_size exist only to pad the table for TP: no probability, no gradient."""
    from training.model.bloom import PAD_LOGIT, Bloom

    cfg = ModelConfig(vocab_size=200, hidden_size=32, num_layers=1, num_heads=2, seq_len=16)
    m = Bloom(cfg)
    assert m.embedding.word_embeddings.weight.shape[0] == 256
    ids = torch.randint(0, 200, (2, 8))
    logits = m(ids)
    assert (logits[..., 200:] == PAD_LOGIT).all() and (logits[..., :200] != PAD_LOGIT).all()
    Bloom.loss(logits[:, :-1], ids[:, 1:]).backward()
    g = m.embedding.word_embeddings.weight.grad
    assert g[200:].abs().max() == 0 and g[:200].abs().max() > 0
    assert torch.softmax(logits.float(), -1)[..., 200:].max() == 0


def test_reading_a_model_s_shapes_imports_no_torchdynamo():
    """Every process that checks a checkpoint builds the model on the meta device; nn.Embedding's
    own init there used to import TorchDynamo (1.6 s)."""
    import subprocess
    import sys

    code = (
        "import sys; from training.config import ModelConfig; from training.model.bloom import full_shapes; "
        "full_shapes(ModelConfig(vocab_size=100, hidden_size=8, num_layers=1, num_heads=2, seq_len=8)); "
        "print('torch._dynamo' in sys.modules)"
    )
    repo = Path(__file__).resolve().parents[3]
    res = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=repo, timeout=120)
    assert res.stdout.strip() == "False", res.stderr[-2000:]
