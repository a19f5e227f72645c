"""Peers of the Phi-2 decode projections, on the same q4 weights and the same DRAM cycling.

``tvm-ext bench phi2-decode --peers ort[,torch]`` times, for each projection (qkv, o, fc1,
fc2, lm_head; K -> N from the config), in the same rounds as the TVM kernels:

ort-acc0 / ort-acc4   ONNX Runtime ``com.microsoft.MatMulNBits`` (bits 4, block 32) at
                      accuracy_level 0 (fp32 compute) and 4 (int8 activations).  The weights
                      are ours, converted bit for bit: our uint32 words hold 8 nibbles along K,
                      low nibble first, so their little-endian bytes already are ORT's
                      B [N, K/32, 16]; scales float32 [N * K/32] (our fp16 scales, exact);
                      zero points 7 packed two per byte (ORT's default is 8); our bias as the
                      node's bias input.  Our value (q - 7) * scale is ORT's (q - zp) * scale.
torch-bf16/-fp32      ``torch.nn.functional.linear`` on the dequantized weights, where torch
                      is importable (else skipped with a logged reason).

DRAM cycling: one ORT graph of C MatMulNBits nodes, each with its own copy of the weights
(copy i = our weights rolled by i rows: same values, distinct memory), all reading the
same x; C copies total >= 2 x LLC (``tvm_ext.bench.dram``); time per node = graph time / C.
One ORT session lives at a time: each timing creates its session (intra-op threads = the
bench's threads, spinning allowed while it runs), times it and drops it, so no idle pool
spins beside the next measurement.  The epilogues our fused kernels also do (gelu on fc1,
the residual adds on o) are not in the peer: they move no weight bytes.
"""
from __future__ import annotations

import numpy as np

from tvm_ext.bench.dram import as_plan, seconds_per_call
from tvm_ext.bench.peers import parse_peers

PEERS = ("ort", "torch")
PROJECTIONS = ("qkv", "o", "fc1", "fc2", "lm_head")
ACCURACY_LEVELS = (0, 4)
GROUP = 32
ZERO_POINT = 7


def parse(text: str | None) -> list[str]:
    """'ort,torch' -> ['ort', 'torch']; ValueError naming an unknown peer."""
    return parse_peers(text, PEERS, "phi2 peer")


def projection_shapes(cfg: dict) -> dict:
    """{projection: (K, N, part)} of a Phi-2 config."""
    d, m, v = cfg["hidden"], cfg["mlp"], cfg["vocab"]
    return {"qkv": (d, 3 * d, "layer"), "o": (d, d, "layer"), "fc1": (d, m, "layer"),
            "fc2": (m, d, "layer"), "lm_head": (d, v, "head")}


def projection_of(name: str, func, part: str, cfg: dict, weight_positions) -> str | None:
    """The projection a GEMV kernel computes: read from its weight argument (q4 words
    [N, K/8] fused, the dequantized float [K, N] unfused) and its part; None for any other
    kernel."""
    if "matmul" not in name:
        return None
    for pos in weight_positions:
        p = func.params[pos]
        shape = [int(s) for s in p.shape]
        if len(shape) != 2:
            continue
        k, n = (shape[1] * 8, shape[0]) if str(p.dtype) == "uint32" else tuple(shape)
        for proj, shape_part in projection_shapes(cfg).items():
            if shape_part == (k, n, part):
                return proj
    return None


def q4_weights(arrays) -> tuple:
    """(packed uint32 [N, K/8], scale [N, K/32], bias [N]) among a fused projection kernel's
    weight arrays, found by dtype and rank (the bias is float32 on CPU, float16 on GPUs)."""
    packed = next(a for a in arrays if a.dtype == np.uint32)
    scale = next(a for a in arrays if a.ndim == 2 and a.dtype == np.float16)
    bias = next(a for a in arrays if a.ndim == 1 and a.dtype.kind == "f")
    return packed, scale, bias


def rolled(arrays, i: int) -> tuple:
    """Copy ``i`` of some weights: every array rolled by ``i`` along its first axis."""
    return tuple(np.roll(a, i, axis=0) if i else np.array(a, copy=True) for a in arrays)


def reference(x, packed, scale, bias, rows: int = 4096):
    """NumPy float64 x @ dequantize(packed, scale) + bias, ``rows`` output rows at a time."""
    from tvm_ext.workloads.phi2.kernels import dequantize_np

    x = np.asarray(x, "float64").reshape(1, -1)
    out = [x @ dequantize_np(packed[r:r + rows], scale[r:r + rows]) for r in range(0, packed.shape[0], rows)]
    return np.concatenate(out, axis=1)[0] + bias.astype("float64")


# ----------------------------------------------------------------------------- ORT
def to_matmulnbits(packed, scale):
    """Our q4 (packed uint32 [N, K/8], fp16 scale [N, K/32]) as MatMulNBits inputs
    (B uint8 [N, K/32, 16], scales float32 [N*K/32], zero_points uint8 [N*ceil(K/64)])."""
    n, kw = packed.shape
    blocks = kw * 8 // GROUP
    b = np.ascontiguousarray(packed.astype("<u4")).view(np.uint8).reshape(n, blocks, GROUP // 2)
    zp = np.full((n, (blocks + 1) // 2), ZERO_POINT | (ZERO_POINT << 4), np.uint8)
    if blocks % 2:  # the last byte of a row holds one zero point, in its low nibble
        zp[:, -1] = ZERO_POINT
    return b, scale.astype("float32").reshape(-1), zp.reshape(-1)


def ort_model(copies, accuracy_level: int, tokens: int = 1) -> bytes:
    """Serialized ONNX graph: one MatMulNBits per weight copy ``(packed, scale, bias)``, all
    reading input ``x`` [tokens, K], outputs ``y<i>`` [tokens, N]."""
    from onnx import TensorProto, helper, numpy_helper

    n, kw = copies[0][0].shape
    k = kw * 8
    nodes, inits, outs = [], [], []
    for i, (packed, scale, bias) in enumerate(copies):
        b, s, zp = to_matmulnbits(packed, scale)
        for name, a in ((f"B{i}", b), (f"s{i}", s), (f"zp{i}", zp), (f"bias{i}", bias.astype("float32"))):
            inits.append(numpy_helper.from_array(a, name))
        nodes.append(helper.make_node("MatMulNBits", ["x", f"B{i}", f"s{i}", f"zp{i}", "", f"bias{i}"], [f"y{i}"],
                                      domain="com.microsoft", K=k, N=n, bits=4, block_size=GROUP,
                                      accuracy_level=accuracy_level))
        outs.append(helper.make_tensor_value_info(f"y{i}", TensorProto.FLOAT, [tokens, n]))
    graph = helper.make_graph(nodes, "matmulnbits",
                              [helper.make_tensor_value_info("x", TensorProto.FLOAT, [tokens, k])], outs, inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17),
                                                    helper.make_opsetid("com.microsoft", 1)])
    return model.SerializeToString()


def ort_session(model: bytes, threads: int, spinning: bool = True):
    """A CPU InferenceSession of the serialized ``model`` with ``threads`` intra-op threads (one
    inter-op), its workers spinning between runs or not."""
    import onnxruntime as ort

    so = ort.SessionOptions()
    so.intra_op_num_threads = threads
    so.inter_op_num_threads = 1
    so.add_session_config_entry("session.intra_op.allow_spinning", "1" if spinning else "0")
    return ort.InferenceSession(model, so, providers=["CPUExecutionProvider"])


class OrtPeer:
    """MatMulNBits at one accuracy level on ``copies`` weight copies of one projection."""

    def __init__(self, projection, base, plan, accuracy_level, threads, x):
        b, s, zp = to_matmulnbits(*base[:2])
        self.plan = as_plan(plan)
        self.bytes = b.nbytes + s.nbytes + zp.nbytes + base[2].nbytes + x.nbytes + base[0].shape[0] * 4
        self.copies = self.plan.copies(self.bytes)
        self.name, self.projection, self.threads = f"ort-acc{accuracy_level}", projection, threads
        self.base = base
        self.model = ort_model([rolled(base, i) for i in range(self.copies)], accuracy_level)
        self.feed = {"x": np.ascontiguousarray(x.reshape(1, -1), "float32")}

    def session(self, spinning: bool = True):
        return ort_session(self.model, self.threads, spinning)

    def output(self):
        """Node 0's output (the unrolled weights) for the input ``x``."""
        sess = self.session(spinning=False)
        return sess.run(["y0"], self.feed)[0][0]

    def seconds(self, repeat: int) -> float:
        """Median over ``repeat`` graph runs of the time per node, in a fresh session."""
        sess = self.session()
        sess.run(None, self.feed)  # warm-up (and ORT's first-run allocations)
        samples = [self.plan.seconds_per_call(lambda: sess.run(None, self.feed), [()]) / self.copies
                   for _ in range(repeat)]
        sess = None  # release the session (its spinning thread pool) before the next one is made
        return float(np.median(samples))


# ----------------------------------------------------------------------------- torch
class TorchPeer:
    """``torch.nn.functional.linear`` in bf16 or fp32 on the dequantized weights, cycled."""

    def __init__(self, projection, base, plan, dtype, threads, x):
        import torch

        from tvm_ext.workloads.phi2.kernels import dequantize_np

        tdt = {"bf16": torch.bfloat16, "fp32": torch.float32}[dtype]
        if threads:
            torch.set_num_threads(threads)
        packed, scale, bias = base
        w = torch.from_numpy(np.ascontiguousarray(dequantize_np(packed, scale).T.astype("float32"))).to(tdt)
        b = torch.from_numpy(bias).to(tdt)
        self.bytes = w.numel() * w.element_size() + b.numel() * b.element_size() + 2 * x.size * w.element_size() \
            + packed.shape[0] * w.element_size()
        self.plan = as_plan(plan)
        self.copies = self.plan.copies(self.bytes)
        self.args = [(torch.from_numpy(x.reshape(1, -1).astype("float32")).to(tdt), torch.roll(w, i, 0).contiguous(),
                      torch.roll(b, i, 0).contiguous()) for i in range(self.copies)]
        self.name, self.projection = f"torch-{dtype}", projection
        self.fn = torch.nn.functional.linear

    def seconds(self, repeat: int) -> float:
        seconds_per_call(self.fn, self.args)  # warm-up pass
        return float(np.median([self.plan.seconds_per_call(self.fn, self.args) for _ in range(repeat)]))


def make_peers(names, weights: dict, plan, threads: int, x_of, log=print) -> list:
    """Peer objects for ``names`` ('ort', 'torch') and ``weights`` {projection: (packed,
    scale, bias)}; ``x_of(K)`` gives the activation row.  A peer whose package is missing is
    skipped with a logged reason ('ort' missing is an error: the user asked for it)."""
    peers = []
    for name in names:
        if name == "torch":
            try:
                import torch  # noqa: F401
            except ImportError:
                log("torch not importable (pip install torch, or the [bench] extra): no torch-bf16/-fp32 peers")
                continue
        elif name == "ort":
            try:
                import onnx  # noqa: F401
                import onnxruntime  # noqa: F401
            except ImportError as err:
                raise ValueError(f"--peers ort needs onnx and onnxruntime (the [bench] extra): {err}") from None
        for proj, base in weights.items():
            x = x_of(base[0].shape[1] * 8)
            if name == "ort":
                peers += [OrtPeer(proj, base, plan, level, threads, x) for level in ACCURACY_LEVELS]
            else:
                peers += [TorchPeer(proj, base, plan, dt, threads, x) for dt in ("bf16", "fp32")]
    return peers
