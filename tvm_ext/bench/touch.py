"""A kernel's memory floor: its traffic with no compute, timed as the kernel is.

``touch_func(func, threads)`` is a PrimFunc with ``func``'s parameters (shapes, dtypes: it takes the
same argument tensors, so the bench times it on the same cycled copies) that reads every 4-byte word
of each parameter ``func`` only reads, xors them into one 16-lane vector, and stores that vector over
every word of each parameter ``func`` writes: each thread its share of the words, in order.  A plain
stream of the kernel's traffic, not a proof of a limit: a kernel that interleaves its reads and
writes can beat it by a little (the decode KV-cache concatenates: 0.88-0.91x).

Why: a kernel's DRAM bound (its bytes / the copy bandwidth of a 512 MiB parallel copy) is out of
reach for a kernel that moves a few kilobytes: the decode LayerNorm reads 20 KiB of gamma and beta
from DRAM, and a single-thread pass over them stalls on the first lines' latency, while waking the
second thread costs ~0.8 us; and a pure read stream beats the copy
bandwidth (the projections' touch: 0.77-0.80x their bound).  The floor, the faster of a 1-thread and
a ``threads``-thread touch, says how far a kernel is from its own traffic's cost.
"""
from __future__ import annotations

from tvm_ext.arrays import param_buffers
from tvm_ext.tir_utils import blocks_of, is_param, shape_bytes

LANES = 16  # uint32 words per vector: one AVX-512 register


def written_params(func) -> set:
    """Positions of the parameters some block of ``func`` writes (the last one where none is found)."""
    written = set()
    for block in blocks_of(func):
        for region in block.writes:
            if is_param(func, region.source):
                written.update(i for i, p in enumerate(func.params) if p.same_as(region.source))
    return written or {len(func.params) - 1}


def touch_source(params, written, threads: int) -> str:
    """TVMScript of the touch kernel (module doc) for ``params`` [(name, dtype, shape)]."""
    args = ", ".join(f"p{i}: T.Buffer({tuple(int(s) for s in shape)}, {dtype!r})"
                     for i, (_, dtype, shape) in enumerate(params))
    loop = f"T.parallel({threads})" if threads > 1 else "range(1)"
    vec, acc = f'"uint32x{LANES}"', f"acc[T.ramp(0, 1, {LANES})]"
    body = []
    for phase in ("read", "write"):
        for i, (_, dtype, shape) in enumerate(params):
            if (i in written) != (phase == "write"):
                continue
            n = shape_bytes(dtype, shape) // 4  # 4-byte words
            if not n:
                continue
            full = n // LANES
            body.append(f"w{i} = T.decl_buffer(({n},), 'uint32', data=p{i}.data)")
            lo, hi = f"t * {full} // {threads}", f"(t + 1) * {full} // {threads}"
            body.append(f"for v in range({lo}, {hi}):")
            if phase == "read":
                body.append(f"    {acc} = {acc} ^ w{i}.vload([v * {LANES}], {vec})")
            else:
                body.append(f"    w{i}[T.ramp(v * {LANES}, 1, {LANES})] = {acc}")
            if n % LANES:  # the last words, by the last thread
                body.append(f"if t == {threads - 1}:")
                body.append(f"    for j in range({full * LANES}, {n}):")
                body.append(f"        acc[0] = acc[0] ^ w{i}[j]" if phase == "read" else f"        w{i}[j] = acc[0]")
    inner = "\n".join("            " + line for line in body)
    return f'''
@T.prim_func(s_tir=True)
def main({args}):
    T.func_attr({{"global_symbol": "main", "tirx.noalias": True, "tirx.is_scheduled": True}})
    with T.sblock("root"):
        for t in {loop}:
            acc = T.decl_buffer(({LANES},), "uint32", scope="local")
            {acc} = T.Broadcast(T.uint32(0), {LANES})
{inner}
'''


def touch_func(func, threads: int = 1):
    """The touch kernel (module doc) of ``func``, its work split over ``threads`` threads."""
    import tvm

    return tvm.script.from_source(touch_source(param_buffers(func), written_params(func), max(1, int(threads))))
