"""The architecture options of our one Phi decoder: what a config (a dict as ``layers.CONFIGS`` holds) may set
beyond the shapes, and ``architecture``, which builds a validated config from a checkpoint's numbers.

The named configs ("full", "reduced") set none of the options, and get ``ARCH_DEFAULTS``: that is the
random-weight benchmark model (embedding tied to lm_head's q4 words, lm_head with a bias).  A checkpoint's
config (``checkpoint.py``) sets them all: Phi-2 has its own embedding table and an lm_head bias.
"""
from __future__ import annotations

GROUP = 32  # input elements per fp16 scale
EPS = 1e-5
ROPE_BASE = 10000.0
# The architecture options a config may set (``arch``); a config without them is the random-weight benchmark
# model: embedding tied to lm_head's q4 words, lm_head with a bias.  ``embed``: "tied" or "table" (Phi-2's own
# (vocab, hidden) table, in the projections' format); ``weights``: "q4" (q4f16_1) or "float32" / "float16" (the
# projections and the table kept float, (out, in) as checkpoints store them; computed in the model's dtype).
ARCH_DEFAULTS = dict(eps=EPS, rope_base=ROPE_BASE, embed="tied", lm_bias=True, weights="q4")
WEIGHT_FORMATS = ("q4", "float32", "float16")


def arch(cfg, key):
    """The architecture option ``key`` of ``cfg`` (``ARCH_DEFAULTS`` where it sets none)."""
    return cfg.get(key, ARCH_DEFAULTS[key])


def architecture(hidden, heads, mlp, vocab, partial_rotary_factor=0.5, eps=EPS, rope_base=ROPE_BASE,
                 embed="table", lm_bias=True, weights="q4", max_positions=2048, name="custom") -> dict:
    """A config (the dict ``CONFIGS`` holds) of any Phi-shaped model, as a checkpoint's config describes it:
    rotary over ``int(head_dim * partial_rotary_factor)`` dims (transformers' rule).  One line (ValueError)
    for a shape our kernels do not take."""
    hidden, heads, mlp, vocab = int(hidden), int(heads), int(mlp), int(vocab)
    if min(hidden, heads, mlp, vocab) < 1 or hidden % heads:
        raise ValueError(f"hidden size {hidden} must be a positive multiple of the {heads} heads")
    head_dim = hidden // heads
    rotary = int(head_dim * float(partial_rotary_factor))
    if rotary % 2 or not 0 <= rotary <= head_dim:
        raise ValueError(f"partial_rotary_factor {partial_rotary_factor} gives {rotary} rotary dims of the head's "
                         f"{head_dim}: need an even number")
    if weights not in WEIGHT_FORMATS:
        raise ValueError(f"weights must be one of {', '.join(WEIGHT_FORMATS)}, not {weights!r}")
    if weights == "q4" and (hidden % GROUP or mlp % GROUP):
        raise ValueError(f"q4 weights take input sizes in whole groups of {GROUP}: hidden {hidden}, "
                         f"intermediate {mlp}")
    if embed not in ("tied", "table"):
        raise ValueError(f"embed must be tied or table, not {embed!r}")
    return dict(hidden=hidden, heads=heads, head_dim=head_dim, mlp=mlp, vocab=vocab, rotary=rotary, eps=float(eps),
                rope_base=float(rope_base), embed=embed, lm_bias=bool(lm_bias), weights=weights,
                max_positions=int(max_positions), name=name)
