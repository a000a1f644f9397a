"""The block-dequant Triton kernel FP8 stacks use (its int64-offset form),
written here as the peer the dequant and MoE-layer benchmarks run beside kjit:
e4m3 codes times 128x128 fp32 multiplier blocks, rounded to the output dtype."""

import triton
import triton.language as tl

BLOCK = 128


@triton.jit
def _triton_block_dequant(x_ptr, s_ptr, y_ptr, M, N, BLOCK: tl.constexpr):
    pid_m = tl.program_id(0)
    pid_n = tl.program_id(1)
    n_blocks = tl.cdiv(N, BLOCK)
    rows = pid_m * BLOCK + tl.arange(0, BLOCK)
    cols = pid_n * BLOCK + tl.arange(0, BLOCK)
    offsets = rows[:, None].to(tl.int64) * N + cols[None, :]  # int64: tensors over 2^31 elements
    mask = (rows[:, None] < M) & (cols[None, :] < N)
    x = tl.load(x_ptr + offsets, mask=mask).to(tl.float32)
    s = tl.load(s_ptr + pid_m * n_blocks + pid_n)
    tl.store(y_ptr + offsets, (x * s).to(y_ptr.dtype.element_ty), mask=mask)


def triton_dequant(x, s, y):
    """y [M, N] = x [M, N] * s [ceil(M / 128), ceil(N / 128)] per block."""
    M, N = x.shape
    _triton_block_dequant[(triton.cdiv(M, BLOCK), triton.cdiv(N, BLOCK))](x, s, y, M, N, BLOCK=BLOCK)
    return y


def triton_dequant_stack(x, s, y):
    """The same over a stack [E, R, C] with scales [E, R / 128, ceil(C / 128)]:
    one launch over the stack seen as [E * R, C], which needs R a multiple of
    128 (the blocks of one expert then never straddle the next)."""
    E, R, C = x.shape
    assert R % BLOCK == 0, f"the stack's rows ({R}) must be a multiple of {BLOCK}"
    triton_dequant(x.view(E * R, C), s.view(E * (R // BLOCK), s.shape[-1]), y.view(E * R, C))
    return y
