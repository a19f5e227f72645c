"""Checks of the plugin's soundness, each a long-running tool behind a CLI command.

``nvcc``         batched, cached nvcc compiles (no GPU needed)
``verify_gpu``   our VerifyGPUCode and TVM's against nvcc on sampled CUDA candidates
``verify_gpu_doc`` its document: cells, reason notes, totals, resume, merge
``equivalence``  numerical equivalence of scheduled candidates over a PrimFunc corpus
``corpus``       the PrimFunc corpus equivalence runs
``build_only``   build-only tuning (no device) and the fusion evidence
"""
