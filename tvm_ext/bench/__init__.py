"""Benchmarks: commands that time tvm_ext against its peers side by side and write JSON.

``int8``         int8 networks: rule sets (and ONNX Runtime) interleaved, bit-exact checked
``peers``        ONNX Runtime as the peer of the int8 benchmarks, per network and per conv
``onnx_export``  our quantized graphs as ONNX QLinear models (for the ORT peer)
``phi2``         Phi-2: one layer's kernels side by side, the whole-model decode and prompt, llama.cpp
"""
