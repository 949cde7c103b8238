"""bf16/fp16 products in fp32 on a CPU without instructions for them (training/model/reduced_on_cpu.py)."""

import torch
import torch.nn.functional as F
from torch.utils._python_dispatch import TorchDispatchMode

from training.model.reduced_on_cpu import Fp32Products, needs_fp32_products, reduced_kernels

CPU = torch.device("cpu")


class Kernels(TorchDispatchMode):
    """Records the operations that reach the kernels under it, with their first input's dtype."""

    def __init__(self):
        super().__init__()
        self.seen: list[tuple[str, torch.dtype]] = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if args and isinstance(args[0], torch.Tensor):
            self.seen.append((func.__name__, args[0].dtype))
        return func(*args, **(kwargs or {}))


def test_products_are_fp32_products_rounded_once():
    """Each product is the fp32 product of the same bf16 inputs, rounded to bf16 once (a tensor
    core's result), forward and backward; non-product operations are left as they are."""
    g = torch.Generator().manual_seed(0)
    a, b = (torch.randn(64, 512, generator=g).bfloat16() for _ in range(2))
    bias = torch.randn(64, generator=g).bfloat16()
    w = torch.randn(64, 512, generator=g).bfloat16().requires_grad_()
    with Kernels() as kernels, Fp32Products(torch.bfloat16):
        mm, lin = a @ b.T, F.linear(a, w, bias)
        bmm = torch.bmm(a[None], b.T[None])
        added = a + b  # not a product
        lin.float().square().sum().backward()
    products = [dt for name, dt in kernels.seen if name.split(".")[0] in ("mm", "addmm", "bmm")]
    assert len(products) == 4 and set(products) == {torch.float32}, kernels.seen  # bf16 kernels never ran
    assert ("add.Tensor", torch.bfloat16) in kernels.seen
    want = (a.float() @ b.float().T).bfloat16()
    assert mm.dtype == lin.dtype == torch.bfloat16 and torch.equal(mm, want) and torch.equal(bmm[0], want)
    assert torch.equal(lin, (a.float() @ w.detach().float().T + bias.float()).bfloat16())
    assert torch.equal(added, a + b) and w.grad.dtype == torch.bfloat16
    grad_out = (2 * lin.float()).bfloat16()  # d(sum(lin^2))/d(lin), rounded as autograd rounds it
    assert torch.equal(w.grad, (grad_out.float().T @ a.float()).bfloat16())


def test_attention_runs_in_fp32_and_keeps_its_dtypes():
    g = torch.Generator().manual_seed(1)
    q, k, v = (torch.randn(2, 4, 128, 16, generator=g).bfloat16().requires_grad_() for _ in range(3))
    with Fp32Products(torch.bfloat16):
        out = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        out.float().sum().backward()
    ref = F.scaled_dot_product_attention(*(x.detach().float() for x in (q, k, v)), is_causal=True)
    assert out.dtype == q.grad.dtype == torch.bfloat16
    assert torch.equal(out, ref.bfloat16())


def test_fp16_overflow_still_rounds_to_inf():
    """DeepSpeed's loss scaler finds an overflow by its inf: an fp16 product beyond fp16's range
    is inf, as on a GPU, though fp32 holds it."""
    a = torch.full((4, 8), 200.0, dtype=torch.float16)
    with Fp32Products(torch.float16):
        out = a @ a.T  # 8 * 40,000 = 320,000 > 65,504
    assert out.dtype == torch.float16 and torch.isinf(out).all()


def test_only_reduced_dtypes_on_a_cpu_without_their_instructions():
    assert not needs_fp32_products(torch.float32, CPU)
    assert not needs_fp32_products(torch.bfloat16, torch.device("cuda"))
    x = torch.randn(8, 8)
    with reduced_kernels(torch.float32, CPU):
        assert torch.equal(x @ x, x @ x)  # nothing replaced, nothing broken
