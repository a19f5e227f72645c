"""Phi-2 benchmarks (``tvm-ext bench phi2-*``, ``tvm-ext generate``).

``layer_bench``  one layer's kernels: fused/unfused x dlight / MetaSchedule / seeded / rule, with peers
``kernels``      which kernels a workload has, builds, checks against NumPy, the bandwidth copy
``measure``      DRAM-honest timing of those kernels and the peers, round by round
``peers``        ONNX Runtime MatMulNBits and torch per projection
``int8``         our int8-activation projections beside the peers
``decode``       the whole-model decode: tok/s against the bandwidth bound, rows interleaved
``prompt``       the whole-model prompt processing: tok/s, time to first token, the GEMMs' TOPS
``llama_cpp``    llama.cpp's llama-bench built from the llama-cpp-python sdist, a Phi-2 Q4_0 GGUF
"""
