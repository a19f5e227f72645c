"""tvm_ext postprocessors, one per file (installed as ``tvm_ext.postprocs``)."""
from .verify_gpu_code import VerifyGPUCode

__all__ = ["VerifyGPUCode"]
