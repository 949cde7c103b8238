"""FlexAttention (model.attention: flex) against the dense SDPA reference: the same function on
documents of length 1, a document cut at the sample's end, padding, and TP-sliced heads."""

from pathlib import Path

import pytest
import torch
import torch.nn.functional as F

from training.model.attention import document_block_mask, flex_document_attention
from training.model.bloom import alibi_slopes, attention_bias, segment_ids_from_offsets


def batch(T=256):
    # sample 0: documents of length 1 then a longer one; 1: the last document cut by the sample's
    # end (it fills the row); 2: padding after 150 tokens; 3: one document over the whole row
    offsets = [[0, 1, 2, 3, 4, 40], [0, 100, 180], [0, 70, 71], [0]]
    lengths = [T, T, 150, T]
    return segment_ids_from_offsets(offsets, lengths, T)


def qkv(B, heads, T, D, dtype, grad=False):
    g = torch.Generator().manual_seed(0)
    return [
        torch.randn(B, heads, T, D, generator=g, dtype=torch.float32).to(dtype).requires_grad_(grad) for _ in range(3)
    ]


def reference(q, k, v, seg, slopes):
    return F.scaled_dot_product_attention(q, k, v, attn_mask=attention_bias(seg, slopes, q.dtype))


def test_flex_equals_the_reference_in_fp32_with_tp_sliced_heads():
    seg = batch()
    slopes = alibi_slopes(8)[4:8]  # TP rank 1 of 2: heads 4..7 and their slopes
    q, k, v = qkv(4, 4, 256, 16, torch.float32)
    with torch.no_grad():
        got = flex_document_attention(q, k, v, seg, slopes)
        want = reference(q, k, v, seg, slopes)
    assert (got - want).abs().max().item() < 1e-5
    # padding queries see only themselves: their output is their own value
    assert torch.allclose(got[2, :, 150:], v[2, :, 150:], atol=1e-6)


def test_one_block_mask_per_micro_batch_and_it_skips_tiles_across_documents():
    seg = batch(512)
    assert document_block_mask(seg) is document_block_mask(seg)  # shared by every layer
    assert document_block_mask(seg.clone()) is not document_block_mask(seg)
    # tiles wholly across documents or above the diagonal are not computed
    assert document_block_mask(segment_ids_from_offsets([[0, 128, 256, 384]], [512], 512)).sparsity() > 60


def test_cpu_training_with_flex_is_refused_with_the_reason():
    seg = batch()
    q, k, v = qkv(4, 4, 256, 16, torch.float32, grad=True)
    if torch.cuda.is_available():
        pytest.skip("a GPU trains with flex")
    with pytest.raises(RuntimeError, match="no CPU backward"):
        flex_document_attention(q, k, v, seg, alibi_slopes(4))
    # and before any rank starts: the train flow's checks
    from bloomline.config import load_config
    from bloomline.errors import ConfigError
    from flows.stages.train_job import validate
    from training.config import TrainRecipe

    recipe = load_config(
        TrainRecipe, Path(__file__).resolve().parents[3] / "configs/train/bloom-tiny.yaml", ["model.attention=flex"]
    )
    with pytest.raises(ConfigError, match="model.attention.*no CPU backward"):
        validate(recipe, "/nonexistent")


@pytest.mark.skipif(not torch.cuda.is_available(), reason="FlexAttention's backward needs a GPU (none in CPU torch)")
def test_flex_gradients_equal_the_reference_on_gpu():
    seg = batch().cuda()
    slopes = alibi_slopes(8)[4:8].cuda()
    a = [t.detach().cuda().requires_grad_() for t in qkv(4, 4, 256, 16, torch.float32)]
    b = [t.detach().clone().requires_grad_() for t in a]
    flex_document_attention(*a, seg, slopes).square().sum().backward()
    reference(*b, seg, slopes).square().sum().backward()
    for x, y in zip(a, b):
        assert (x.grad - y.grad).abs().max().item() < 1e-5


def test_the_model_computes_the_same_function_with_either_kernel():
    import dataclasses

    from bloomline.config import load_config
    from training.config import ModelConfig
    from training.model.bloom import Bloom

    cfg = load_config(ModelConfig, Path(__file__).resolve().parents[3] / "configs/model/bloom-tiny.yaml")
    torch.manual_seed(0)
    sdpa = Bloom(dataclasses.replace(cfg, attention="sdpa")).eval()
    flex = Bloom(dataclasses.replace(cfg, attention="flex")).eval()
    flex.load_state_dict(sdpa.state_dict())
    seg = batch()
    ids = torch.randint(0, cfg.vocab_size, seg.shape)
    with torch.no_grad():
        assert (flex(ids, seg) - sdpa(ids, seg)).abs().max().item() < 1e-4


def test_auto_resolves_to_the_kernel_that_can_train_and_is_faster():
    from training.config import ModelConfig
    from training.loop.kernel_choice import choose_kernel, measure_kernels, set_kernel
    from training.model.bloom import Bloom

    cfg = ModelConfig(vocab_size=300, hidden_size=64, num_layers=2, num_heads=4, seq_len=256)
    assert cfg.attention == "auto"
    cpu = measure_kernels(cfg, batch(), torch.bfloat16, torch.device("cpu"))
    assert list(cpu) == ["sdpa"] and choose_kernel(cpu) == "sdpa"  # no FlexAttention backward on CPU
    assert choose_kernel({"sdpa": 2.0, "flex": 1.0}) == "flex" and choose_kernel({"sdpa": 1.0, "flex": 2.0}) == "sdpa"
    model = Bloom(cfg)
    assert {b.attn.kernel for b in model.blocks} == {"sdpa"}  # auto runs sdpa until the trainer chose
    set_kernel(model, "flex")
    assert {b.attn.kernel for b in model.blocks} == {"flex"}


@pytest.mark.skipif(not torch.cuda.is_available(), reason="FlexAttention trains on GPU only")
def test_auto_times_both_kernels_on_gpu():
    from training.config import ModelConfig
    from training.loop.kernel_choice import measure_kernels

    cfg = ModelConfig(vocab_size=300, hidden_size=256, num_layers=2, num_heads=4, seq_len=256)
    t = measure_kernels(cfg, batch(), torch.bfloat16, torch.device("cuda"))
    assert set(t) == {"sdpa", "flex"} and all(v > 0 for v in t.values())
