"""Pattern analysis behind the rules, apart from the schedules (as dlight keeps ``analysis/``).

* ``gemv_pattern``: which blocks form a dequantize-GEMV (a q4 decode projection);
* ``contraction_pattern``: a single-block contraction (decode attention's two products).

Detection is by structure (dtypes, shapes, index expressions), never by block or buffer name.
"""
