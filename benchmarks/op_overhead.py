"""Per-call cost of calling the native kernels through their PyTorch operators, at a small size
where the Python around a call is what a call costs.

    python benchmarks/op_overhead.py [--rounds 12] [--threads 1] [--shape 1 2 32 16]

Rows are timed in ``--rounds`` rounds, interleaved: each round times every row once (the median
call of a ≥ 0.2 s ``torch.utils.benchmark`` block), and the first row of each group, the
reference, twice, so that its second timing against its first is the group's noise floor. Each
row reads as the geometric-mean ratio to its group's reference over the rounds, with a 95 %
Student-t interval on the per-round log ratios (:func:`attnscale.measure.ratio_interval.
log_ratio_interval`), and as the median extra microseconds per call. Groups:

* softcap forward, no autograd: the kernel module called directly (the pybind function, as the
  package called it before the operators) against ``torch.ops.attnscale.softcap_attention``;
* softcap forward + backward (``out.sum().backward()``) of one autograd.Function calling the
  kernel directly, against the package's :class:`attnscale.core.native.SoftcapAttention`
  (the same Function, calling the two operators), and against the same operator pair made
  differentiable with ``torch.library.register_autograd`` instead (a throwaway ``bench_ops``
  namespace): the registration the package does not use, for what it would cost;
* row normalization (RMS) forward and backward, direct against the operators.

Prints one JSON object {"shape", "threads", "rounds", "rows": [{"group", "path", "us",
"overhead_us", "ratio", "lo", "hi"}]}, a "noise floor" row (the reference against itself) first
in each group.
"""

from __future__ import annotations

import argparse
import json
from collections.abc import Callable
from statistics import median

import torch
import torch.utils.benchmark as tb
from torch import Tensor

from attnscale.core import native, native_rows
from attnscale.measure.ratio_interval import log_ratio_interval

ROUNDS = 12


def parse_args() -> argparse.Namespace:
    """The command line (see the module docstring)."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=ROUNDS)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--shape", type=int, nargs=4, default=[1, 2, 32, 16],
                        metavar=("B", "H", "N", "D"))
    return parser.parse_args()


def direct_function(kernel) -> Callable[..., Tensor]:
    """softcap attention as an autograd.Function calling the pybind module itself."""

    class Direct(torch.autograd.Function):
        @staticmethod
        def forward(ctx, q, k, v, mask, is_causal, scale, caps):
            out, lse = kernel.forward(q, k, v, mask, is_causal, scale, caps)
            ctx.save_for_backward(q, k, v, out, lse)
            ctx.args = (mask, is_causal, scale, caps)
            return out

        @staticmethod
        @torch.autograd.function.once_differentiable
        def backward(ctx, grad_out):
            q, k, v, out, lse = ctx.saved_tensors
            mask, is_causal, scale, caps = ctx.args
            dq, dk, dv = kernel.backward(grad_out, q, k, v, out, lse, mask, is_causal, scale,
                                         caps)
            return dq, dk, dv, None, None, None, None

    return Direct.apply


def registered_autograd(kernel) -> tuple[torch.library.Library, Callable[..., Tensor]]:
    """The softcap operator pair in a throwaway namespace, differentiable through
    ``torch.library.register_autograd``; returns (the library, keeping it alive; the call)."""
    lib = torch.library.Library("bench_ops", "DEF")
    lib.define("fwd(Tensor q, Tensor k, Tensor v, Tensor? mask, bool is_causal, float scale, "
               "float[] caps) -> (Tensor, Tensor)")
    lib.define("bwd(Tensor g, Tensor q, Tensor k, Tensor v, Tensor out, Tensor lse, Tensor? mask, "
               "bool is_causal, float scale, float[] caps) -> (Tensor, Tensor, Tensor)")
    lib.impl("fwd", lambda *args: tuple(kernel.forward(*args)), "CPU")
    lib.impl("bwd", lambda *args: tuple(kernel.backward(*args)), "CPU")
    lib.impl("bwd", torch.library.fallthrough_kernel, "Autograd")

    def setup(ctx, inputs, output):
        q, k, v, mask, is_causal, scale, caps = inputs
        ctx.save_for_backward(q, k, v, *output)
        ctx.args = (mask, is_causal, scale, caps)
        ctx.mark_non_differentiable(output[1])

    @torch.autograd.function.once_differentiable
    def backward(ctx, grad_out, grad_lse):
        q, k, v, out, lse = ctx.saved_tensors
        mask, is_causal, scale, caps = ctx.args
        grads = torch.ops.bench_ops.bwd(grad_out, q, k, v, out, lse, mask, is_causal, scale, caps)
        return (*grads, None, None, None, None)

    torch.library.register_autograd("bench_ops::fwd", backward, setup_context=setup, lib=lib)
    return lib, lambda *args: torch.ops.bench_ops.fwd(*args)[0]


def cases(shape: list[int]) -> tuple[list[tuple[str, str, Callable[[], object]]], object]:
    """(group, path, zero-argument call) rows, and what must stay alive while they run."""
    soft, rows = native.softcap_kernel(), native_rows.row_kernel()
    if soft is None or rows is None:
        raise SystemExit("the native kernels are not available here: nothing to measure")
    g = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(shape, generator=g) for _ in range(3))
    qg, kg, vg = (t.clone().requires_grad_() for t in (q, k, v))
    caps, scale = [50.0] * shape[1], shape[3] ** -0.5
    lib, registered = registered_autograd(soft)
    direct = direct_function(soft)

    def train(fn: Callable[..., Tensor]) -> Callable[[], None]:
        return lambda: fn(qg, kg, vg, None, False, scale, caps).sum().backward()

    y, r, d = rows.forward(q, 1, 1e-6)
    dy = torch.randn(shape, generator=g)
    ops = torch.ops.attnscale
    table = [
        ("softcap forward", "direct", lambda: soft.forward(q, k, v, None, False, scale, caps)),
        ("softcap forward", "operator",
         lambda: ops.softcap_attention.default(q, k, v, None, False, scale, caps)),
        ("softcap forward+backward", "direct Function", train(direct)),
        ("softcap forward+backward", "operators (SoftcapAttention)",
         train(native.SoftcapAttention.apply)),
        ("softcap forward+backward", "register_autograd (not used)", train(registered)),
        ("rms forward", "direct", lambda: rows.forward(q, 1, 1e-6)),
        ("rms forward", "operator", lambda: ops.row_norm.default(q, "rms", 1e-6)),
        ("rms backward", "direct", lambda: rows.backward(y, dy, r, d, False)),
        ("rms backward", "operator", lambda: ops.row_norm_backward.default(y, dy, r, d, False)),
    ]
    return table, lib


def main() -> None:
    """Time every row in interleaved rounds; print ratios to each group's reference as JSON."""
    args = parse_args()
    if args.rounds < 3:
        raise SystemExit("--rounds: need at least 3 for an interval")
    torch.set_num_threads(args.threads)
    table, keep_alive = cases(args.shape)
    reference: dict[str, Callable[[], object]] = {}
    for group, _, fn in table:
        reference.setdefault(group, fn)
    rows = [(group, "noise floor (reference again)", fn) for group, fn in reference.items()]
    rows += table
    times: dict[tuple[str, str], list[float]] = {(g, p): [] for g, p, _ in rows}
    for _ in range(args.rounds):
        for group, path, fn in rows:
            fn()
            block = tb.Timer("fn()", globals={"fn": fn}).blocked_autorange(min_run_time=0.2)
            times[group, path].append(block.median)
    out = []
    for group in reference:
        base = times[group, next(p for g, p, _ in table if g == group)]
        for g, path, _ in rows:
            if g != group:
                continue
            mine = times[group, path]
            ratio = log_ratio_interval(mine, base)
            out.append({"group": group, "path": path, "us": round(median(mine) * 1e6, 1),
                        "overhead_us": round((median(mine) - median(base)) * 1e6, 1),
                        **{k: round(ratio[k], 3) for k in ("ratio", "lo", "hi")}})
    del keep_alive
    print(json.dumps({"shape": args.shape, "threads": args.threads, "rounds": args.rounds,
                      "rows": out}, indent=1))


if __name__ == "__main__":
    main()
