"""The Workload record shared by every workload builder."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable, Sequence

import numpy as np


@dataclass
class Workload:
    """A Relax model plus what is needed to check a compiled version of it.

    mod:       Relax IRModule with entry ``main``; weights are bound as constants so
               that ``main`` takes only the activations in ``inputs``.
    inputs:    example inputs, generated from the workload's seed.
    reference: NumPy function computing ``main``'s output from ``inputs``.
    exact:     True when the compiled output must equal the reference bit for bit
               (integer networks); otherwise ``rtol``/``atol`` apply.
    options:   the options the workload was built with (batch, image size, seed, ...),
               recorded in tuning databases so a database is not reused for another build.
    """

    name: str
    mod: Any
    inputs: Sequence[np.ndarray]
    reference: Callable[[Sequence[np.ndarray]], np.ndarray]
    exact: bool = True
    rtol: float = 0.0
    atol: float = 0.0
    options: dict = field(default_factory=dict)

    def check(self, output: np.ndarray) -> tuple[bool, str]:
        """Compare ``output`` with the reference; returns (ok, one-line summary)."""
        expected = self.reference(self.inputs)
        if output.shape != expected.shape:
            return False, f"shape {output.shape} != reference {expected.shape}"
        if self.exact:
            diff = np.count_nonzero(output != expected)
            return diff == 0, f"{diff} of {expected.size} elements differ"
        ok = np.allclose(output, expected, rtol=self.rtol, atol=self.atol)
        err = float(np.max(np.abs(output.astype("float64") - expected.astype("float64"))))
        return bool(ok), f"max abs error {err:.3g} (rtol={self.rtol}, atol={self.atol})"
