"""The Phi-2 decode step scheduled by ``tvm_ext.ApplySchedules`` and compiled: what the benches and text
generation run.

``schedule(mod, target, how, database)`` schedules every kernel of a model's module (``how``: one of
``rulesets.SCHEDULES``; ``tuned`` reads a tuning work dir), leaving the in-place KV-cache writes as
written; ``decoder(model, target, how)`` compiles the scheduled module into a ``model.Decoder``.
"""
from __future__ import annotations

import time

KV_WRITES = ("kv_write", "kv_write_prompt")  # the in-place KV-cache writes: never scheduled


def schedule(mod, target, how="dlight", database=None):
    """(``mod`` scheduled ``how`` by ``tvm_ext.ApplySchedules``, {kernel: what scheduled it}); ``tuned``
    reads the work dir ``database`` (``tune.seeds.tuned_inputs``: refused in one line where its records need
    instructions ``target`` lacks); the in-place KV writes are left."""
    from tvm_ext.scheduling import schedule_module
    from tvm_ext.tune.seeds import tuned_inputs

    db, kept = tuned_inputs(database, target) if how == "tuned" else (None, ())
    return schedule_module(mod, target, how, db, kept, skip=KV_WRITES)


def decoder(model, target="llvm", how="dlight", dev=None, log=None, database=None, share=None):
    """``model.Decoder`` of ``model`` scheduled ``how`` and compiled for ``target``
    (``share``: a Decoder of the same model whose uploaded weights it reuses); its ``rules``
    attribute says which schedule each kernel got."""
    import tvm

    from tvm_ext.targets import resolve_target
    from tvm_ext.workloads.phi2.model import Decoder

    log = log or (lambda msg: None)
    target = resolve_target(target)
    t0 = time.time()
    mod, used = schedule(model.mod, target, how, database)
    ex = tvm.compile(mod, target=target)
    log(f"built {model.config} decode step ({how}) in {time.time() - t0:.0f} s")
    dec = Decoder(model, ex, dev=dev, log=log, share=share)
    dec.rules = used
    return dec
