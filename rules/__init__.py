"""tvm_ext schedule rules, one per file (installed as ``tvm_ext.rules``)."""
from .apply_block_attr import ApplyBlockAttrRule, register_custom_rules
from .dequant_gemv import DequantGEMV
from .inline_constant_scalars import InlineConstantScalars, is_constant_scalar_block
from .q4_int8_gemm import Q4Int8GEMM

__all__ = ["ApplyBlockAttrRule", "DequantGEMV", "InlineConstantScalars", "Q4Int8GEMM", "is_constant_scalar_block",
           "register_custom_rules"]
