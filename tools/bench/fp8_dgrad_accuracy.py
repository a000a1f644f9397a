"""How much accuracy an FP8 dX would cost the training backward, on the CPU (no GPU, no kjit): dX = dY W through
frozen FP8 weights, with dY as the training path has it (bf16, W8A16: what kjit runs) against dY quantized to e4m3
in 1 x 128 blocks along the reduction (what a W8A8 dX would read), both with fp32 sums and a bf16 result, each
against the fp64 product of the same bf16 dY and dequantised weights. Issue 37 admits an FP8 dX only if it "stays as
accurate"; this is the measurement that decides it (decision 0021).
    python3 tools/bench/fp8_dgrad_accuracy.py [--rows 2048] [--n 2048] [--k 1024]"""

import argparse

import torch

E4M3_MAX = 448.0


def e4m3_rows(x: torch.Tensor, block: int = 128) -> torch.Tensor:
    """x quantized in 1 x block groups along its last dimension (scale = amax / 448, codes rounded to nearest),
    dequantized in fp64."""
    rows, cols = x.shape
    groups = x.view(rows, cols // block, block)
    scale = groups.abs().amax(-1, keepdim=True).clamp(min=1e-30) / E4M3_MAX
    return ((groups / scale).to(torch.float8_e4m3fn).double() * scale).view(rows, cols)


def e4m3_blocks(w: torch.Tensor, block: int = 128) -> torch.Tensor:
    """w quantized in block x block tiles (DeepSeek-V3's weights), dequantized in fp64."""
    n, k = w.shape
    tiles = w.view(n // block, block, k // block, block)
    scale = tiles.abs().amax(dim=(1, 3), keepdim=True).clamp(min=1e-30) / E4M3_MAX
    return ((tiles / scale).to(torch.float8_e4m3fn).double() * scale).view(n, k)


def relative_error(a: torch.Tensor, b: torch.Tensor) -> float:
    return ((a - b).norm() / b.norm()).item()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rows", type=int, default=2048)
    parser.add_argument("--n", type=int, default=2048, help="the forward's output width: dX's reduction")
    parser.add_argument("--k", type=int, default=1024, help="the forward's input width: dX's columns")
    args = parser.parse_args()
    torch.manual_seed(0)
    shape = (args.rows, args.n)
    gradients = {
        "normal": lambda: torch.randn(shape, dtype=torch.float64),
        "heavy-tailed (Student t, 3 dof)": lambda: torch.distributions.StudentT(3.0).sample(shape).double(),
        "rows of mixed scale (e^(2 N(0,1)))": lambda: torch.randn(shape, dtype=torch.float64)
        * torch.exp(2 * torch.randn(args.rows, 1, dtype=torch.float64)),
    }
    w = e4m3_blocks(torch.randn(args.n, args.k, dtype=torch.float64) / args.n ** 0.5)
    print(f"# dX = dY W, rows {args.rows}, reduction {args.n}, columns {args.k}; relative Frobenius error against fp64")
    print("| dY | W8A16 (bf16 dY) | W8A8 (e4m3 dY, 1 x 128) | ratio |")
    print("|---|---:|---:|---:|")
    for name, draw in gradients.items():
        dy = draw().to(torch.bfloat16).double()  # the backward's dY is bf16
        reference = dy @ w
        w8a16 = (dy.float() @ w.float()).to(torch.bfloat16).double()
        w8a8 = (e4m3_rows(dy).float() @ w.float()).to(torch.bfloat16).double()
        a, b = relative_error(w8a16, reference), relative_error(w8a8, reference)
        print(f"| {name} | {a:.2e} | {b:.2e} | {b / a:.1f}x |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
