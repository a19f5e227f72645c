"""tvm_ext schedule rules, one per file (installed as ``tvm_ext.rules``)."""
from .apply_block_attr import ApplyBlockAttrRule, register_custom_rules
from .contraction_cpu import ContractionCPU
from .contraction_cuda import ContractionCUDA
from .dequant_gemv import DequantGEMV
from .dequant_gemv_cuda import DequantGEMVCUDA
from .injective_cpu import InjectiveCPU
from .int8_tensor_core_cuda import Int8TensorCoreCUDA
from .inline_constant_scalars import InlineConstantScalars, is_constant_scalar_block
from .q4_int8_gemm import Q4Int8GEMM
from .row_norm_cpu import RowNormCPU

__all__ = ["ApplyBlockAttrRule", "ContractionCPU", "ContractionCUDA", "DequantGEMV", "DequantGEMVCUDA", "InjectiveCPU",
           "Int8TensorCoreCUDA", "InlineConstantScalars", "Q4Int8GEMM", "RowNormCPU", "is_constant_scalar_block",
           "register_custom_rules"]
