"""tvm_ext's int8-activation projections (``tvm_ext.workloads.phi2.q4_int8_gemm`` for one token,
scheduled by rules/q4_int8_gemm.py untuned) in the Phi-2 decode bench, timed like the peers:
``tvm-ext bench phi2-decode --int8``.

Per projection one ``Int8Projection``: the activation quantize kernel and the int8 GEMV (bias
epilogue, as the ORT MatMulNBits peer computes), both called per step as a decode would, on
the same q4 weights as the fused float kernel and the peers (repacked: ``q4_int8_gemm.repack``),
cycled through copies whose bytes exceed 2 x the last-level cache (copy i = the weights rolled
by i rows, as ``peers.rolled`` makes them).  ``output()`` is copy 0's result for the bench's
activation row; ``measure.check_peers`` reports its error against the float reference,
as it does ORT's: the int8 arithmetic is a different computation and says so.
"""
from __future__ import annotations

import numpy as np

from tvm_ext.bench.dram import as_plan, seconds_per_call
from tvm_ext.bench.phi2.peers import rolled

NAME = "rule-int8"


class Int8Projection:
    """Quantize + int8 GEMV of one projection on ``copies`` weight copies."""

    def __init__(self, projection, base, plan, target, dev, x):
        import tvm

        from tvm_ext.rules import q4_int8_gemm as rule
        from tvm_ext.targets import resolve_target
        from tvm_ext.workloads.phi2 import q4_int8_gemm as g

        target = resolve_target(target)  # what is checked is what is compiled ("llvm": the host's CPU)
        g.check_target(target)
        packed, scale, bias = base
        n, kw = packed.shape
        k = kw * 8
        self.name, self.projection, self.base = NAME, projection, base
        self.bytes = packed.nbytes + scale.nbytes + bias.nbytes + x.nbytes + n * 4
        self.plan = as_plan(plan)
        self.copies = self.plan.copies(self.bytes)

        def build(func):
            mod = tvm.IRModule({"main": func.with_attr("global_symbol", "main")})
            mod = rule.Q4Int8GEMM().apply_to_module(mod, target)
            return tvm.compile(mod, target=target)["main"]

        self.quantize = build(g.quantize_tokens(1, k))
        self.gemv = build(g.gemm(1, n, k, "bias", str(scale.dtype)))
        up = lambda a: tvm.runtime.tensor(a, dev)  # noqa: E731
        self.x = up(np.ascontiguousarray(x.reshape(1, 1, k), "float32"))
        self.feed = {"x": x.reshape(1, -1)}  # what check_peers reads
        self.acts = [up(np.zeros((1, k // 8, 2, 4), "int8")), up(np.zeros((1, k // g.GROUP), "float32")),
                     up(np.zeros((1, k // g.GROUP), "int32"))]
        self.y = up(np.zeros((1, 1, n), "float32"))
        self.sets = []
        for i in range(self.copies):
            p, s, b = rolled(base, i)
            self.sets.append(tuple(up(a) for a in (*g.repack(p, s), b)))

    def _call(self, wq, ws, bias):
        self.quantize(self.x, *self.acts)
        self.gemv(*self.acts, wq, ws, bias, self.y)

    def output(self):
        """Copy 0's output (the unrolled weights) for the input ``x``."""
        self._call(*self.sets[0])
        return self.y.numpy().reshape(-1)

    def seconds(self, repeat: int) -> float:
        """Median over ``repeat`` passes through all copies of the time per call."""
        seconds_per_call(self._call, self.sets)  # warm-up pass
        return float(np.median([self.plan.seconds_per_call(self._call, self.sets) for _ in range(repeat)]))


def make_int8(weights: dict, plan, target, dev, x_of) -> list:
    """``Int8Projection`` per projection of ``weights`` {projection: (packed, scale, bias)};
    ``x_of(K)`` gives the activation row (the peers' rows: same inputs)."""
    return [Int8Projection(proj, base, plan, target, dev, x_of(base[0].shape[1] * 8)) for proj, base in weights.items()]
