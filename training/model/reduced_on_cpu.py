"""bf16 and fp16 matrix products on a CPU that has no instructions for them, computed in fp32.

PyTorch's CPU kernels for bf16 and fp16 matrix products and flash attention fall back to
reference loops on a CPU without bf16/fp16 instructions (no AVX512-BF16, AMX or AVX512-FP16,
as oneDNN reports). Measured on a 2-core AVX2 machine (torch 2.13): a (2048 x 64) . (64 x 4000)
product, bloom-tiny's output layer, takes 458 ms in bf16 against 20 ms in fp32, and a bloom-tiny
training step of 8,192 tokens 8.4 s against 1.1 s in fp32.

On such a CPU, :func:`reduced_kernels` computes these operations on fp32 copies of their inputs
and rounds each result once to the inputs' dtype: what a GPU's tensor cores compute (bf16 or fp16
inputs, fp32 accumulation, one rounding of the output), so the training is still a bf16 (fp16)
training, with its weights, activations and gradients in that dtype; an fp16 product too large
for fp16 still rounds to inf, as DeepSpeed's loss scaler expects. Everything else runs as it is.
"""

from __future__ import annotations

import contextlib
from typing import Any, Iterator

import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_map

aten = torch.ops.aten
FLASH_FORWARD = aten._scaled_dot_product_flash_attention_for_cpu.default
# the operations whose reduced-precision CPU kernels are reference loops (profiled: 97% of a
# bloom-tiny bf16 step); linear layers and attention reach the dispatcher as these
PRODUCTS = {
    aten.mm.default,
    aten.addmm.default,
    aten.bmm.default,
    aten.baddbmm.default,
    FLASH_FORWARD,
    aten._scaled_dot_product_flash_attention_for_cpu_backward.default,
}
REDUCED = (torch.bfloat16, torch.float16)


def native_kernels(dtype: torch.dtype) -> bool:
    """Whether this CPU computes ``dtype`` products with its own instructions (oneDNN's check,
    the one PyTorch's CPU kernels take their fast path by). Assumed so when the check is missing."""
    check = {torch.bfloat16: "_is_mkldnn_bf16_supported", torch.float16: "_is_mkldnn_fp16_supported"}.get(dtype)
    if check is None:
        return True
    try:
        return bool(getattr(torch.ops.mkldnn, check)())
    except (AttributeError, RuntimeError):
        return True


class Fp32Products(TorchDispatchMode):
    """Runs :data:`PRODUCTS` on CPU tensors of ``dtype`` in fp32, rounding results to ``dtype``.
    The flash-attention forward's logsumexp stays fp32, as PyTorch's own kernel returns it."""

    def __init__(self, dtype: torch.dtype):
        super().__init__()
        self.dtype = dtype

    def __torch_dispatch__(self, func: Any, types: Any, args: tuple = (), kwargs: dict | None = None) -> Any:
        kwargs = kwargs or {}
        first = args[0] if args else None
        if func not in PRODUCTS or not isinstance(first, torch.Tensor) or first.dtype != self.dtype:
            return func(*args, **kwargs)
        if first.device.type != "cpu":
            return func(*args, **kwargs)
        up = lambda x: x.float() if isinstance(x, torch.Tensor) and x.dtype == self.dtype else x  # noqa: E731
        out = func(*tree_map(up, args), **tree_map(up, kwargs))
        down = lambda x: x.to(self.dtype) if isinstance(x, torch.Tensor) and x.dtype == torch.float32 else x  # noqa: E731
        if func is FLASH_FORWARD:
            return down(out[0]), *out[1:]
        return tree_map(down, out)


def needs_fp32_products(dtype: torch.dtype, device: torch.device) -> bool:
    """Whether :func:`reduced_kernels` replaces anything: ``dtype`` bf16 or fp16 on a CPU without
    native kernels for it."""
    return device.type == "cpu" and dtype in REDUCED and not native_kernels(dtype)


@contextlib.contextmanager
def reduced_kernels(dtype: torch.dtype, device: torch.device) -> Iterator[None]:
    """Within it, this thread's ``dtype`` products (and the backward passes it starts) run in
    fp32 when :func:`needs_fp32_products`; otherwise it changes nothing."""
    if not needs_fp32_products(dtype, device):
        yield
        return
    with Fp32Products(dtype):
        yield
