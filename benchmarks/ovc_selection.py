"""OVC's point selection: greedy pivoted Cholesky from the diagonal and the chosen columns
(`select_pivoted_cholesky`) against linear_operator's `pivoted_cholesky` of the full Gram matrix,
side by side in one run, with the same pivots checked.

    python benchmarks/ovc_selection.py
"""

from __future__ import annotations

import argparse
import time

import gpytorch
import torch
from linear_operator.functions import pivoted_cholesky

from gpytorch_hippo.inducing import select_pivoted_cholesky

#: (candidates N, points M): sunspots/irradiance-sized tasks, a speech task, hourly irradiance
SIZES = ((80, 50), (300, 150), (1_000, 100), (1_000, 200), (4_000, 1_000))


def full_gram(kernel, candidates, num):
    with torch.no_grad():
        _, pivots = pivoted_cholesky(kernel(candidates).to_dense(), rank=num, error_tol=0.0, return_pivots=True)
    return candidates[pivots[:num]]


def seconds(function, repeats):
    function()
    start = time.perf_counter()
    for _ in range(repeats):
        function()
    return (time.perf_counter() - start) / repeats


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--threads", type=int, default=1)
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)
    kernel = gpytorch.kernels.ScaleKernel(gpytorch.kernels.RBFKernel()).double()
    print(f"{'N':>6} {'M':>6} {'full Gram (s)':>14} {'columns (s)':>12} {'speed-up':>9} {'same pivots':>12}")
    for n, m in SIZES:
        candidates = torch.sort(torch.rand(n, 1, generator=torch.Generator().manual_seed(n), dtype=torch.float64) * n, 0).values
        kernel.base_kernel.lengthscale = 3.0
        repeats = 5 if n * m < 1e6 else 1
        old = seconds(lambda: full_gram(kernel, candidates, m), repeats)
        new = seconds(lambda: select_pivoted_cholesky(kernel, candidates, m), repeats)
        same = torch.equal(full_gram(kernel, candidates, m), select_pivoted_cholesky(kernel, candidates, m))
        print(f"{n:>6} {m:>6} {old:>14.4f} {new:>12.4f} {old / new:>8.1f}x {str(same):>12}")


if __name__ == "__main__":
    main()
