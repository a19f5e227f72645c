"""Benchmarks: commands that time tvm_ext against its peers side by side and write JSON.

``int8``         int8 networks: rule sets (and ONNX Runtime) interleaved, bit-exact checked
``peers``        ONNX Runtime as the peer of the int8 benchmarks, per network and per conv
``onnx_export``  our quantized graphs as ONNX QLinear models (for the ORT peer)
``phi2``         Phi-2 kernels: fused/unfused x dlight/MetaSchedule/seeded, side by side
``phi2_kernels`` their dlight schedules, builds, checks against NumPy and seeded databases
"""
