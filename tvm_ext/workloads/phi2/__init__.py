"""Phi-2 q4 (q4f16_1 / q4f32_1 weights) as tvm_ext builds it.

``layers``        one decoder layer's Relax ops (float or int8-activation projections), random weights,
                  NumPy references
``model``         the whole model on the Relax VM: decode step, prompt prefill, the Decoder that runs it
``compiled``      the model's module scheduled (``tvm_ext.ApplySchedules``) and compiled: ``decoder``
``kernels``       one layer as a Relax workload for the kernel bench (decode / prefill, fused or not)
``q4_int8_gemm``  the q4 x int8 GEMM (one token or many) and its activation quantize kernel
``gelu``          gelu_tanh in TE and NumPy
``arch``          the architecture options a config may set (embedding, lm_head bias, rotary, float weights)
``checkpoint``    ``load(path)``: a user's checkpoint mapped onto the decoder (readers ``hf``, ``mlc``,
                  ``gguf_file``; ``tokenizer``), ``text``: generating text with it
"""


def load(path, weights="q4", layers=None):
    """A Phi-2 checkpoint (Hugging Face directory, MLC directory or GGUF file): ``checkpoint.load``."""
    from .checkpoint import load as _load

    return _load(path, weights=weights, layers=layers)
