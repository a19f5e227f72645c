"""tvm_ext postprocessors, one per file (installed as ``tvm_ext.postprocs``)."""
from .thread_extent_precheck import ThreadExtentPrecheck
from .verify_gpu_code import VerifyGPUCode

__all__ = ["ThreadExtentPrecheck", "VerifyGPUCode"]
