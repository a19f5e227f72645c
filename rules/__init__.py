"""tvm_ext schedule rules, one per file (installed as ``tvm_ext.rules``)."""
from .apply_block_attr import ApplyBlockAttrRule, register_custom_rules
from .dequant_gemv import DequantGEMV
from .inline_constant_scalars import InlineConstantScalars, is_constant_scalar_block

__all__ = ["ApplyBlockAttrRule", "DequantGEMV", "InlineConstantScalars", "is_constant_scalar_block",
           "register_custom_rules"]
