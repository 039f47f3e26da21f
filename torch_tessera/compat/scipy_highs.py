"""Writing a MILP as an MPS file through the HiGHS that SciPy bundles.

Why here: ``scipy.optimize.milp`` solves with HiGHS but has no public way to export the model; SciPy's private
``scipy.optimize._highspy._core`` binds HiGHS' ``Highs.passModel`` / ``writeModel``. Checked on SciPy 1.17.1
(2026-11-29). Anything else touching SciPy internals belongs in this module.
"""

from __future__ import annotations

import os

import numpy as np
from scipy.sparse import csc_matrix, spmatrix

from torch_tessera.errors import TesseraError


def write_mps(path: str | os.PathLike, c: np.ndarray, integrality: np.ndarray, lb: np.ndarray, ub: np.ndarray,
              A: spmatrix, row_lo: np.ndarray, row_hi: np.ndarray) -> None:
    """Write ``min c.x  s.t.  row_lo <= A x <= row_hi,  lb <= x <= ub,  x_j integer where integrality_j == 1``.

    Args:
        path: the ``.mps`` file to write (HiGHS picks the format from the suffix).
        c: objective coefficients, shape ``[n]`` (the scheduler's units: seconds, scaled).
        integrality: ``[n]`` of 0 (continuous) / 1 (integer), as ``scipy.optimize.milp`` takes it.
        lb, ub: variable bounds ``[n]`` (``inf`` allowed).
        A: constraint matrix ``[m, n]``.
        row_lo, row_hi: row bounds ``[m]``.

    Raises:
        TesseraError: this SciPy has no bundled HiGHS binding, or HiGHS refused the model or the file.
    """
    try:
        from scipy.optimize._highspy import _core
    except ImportError as e:  # pragma: no cover - depends on the SciPy build
        raise TesseraError(f"cannot dump the MILP: this SciPy has no bundled HiGHS binding ({e})") from e
    a = csc_matrix(A)
    n, m = a.shape[1], a.shape[0]
    lp = _core.HighsLp()
    lp.num_col_, lp.num_row_ = n, m
    lp.col_cost_ = np.asarray(c, float)
    lp.col_lower_, lp.col_upper_ = np.asarray(lb, float), np.asarray(ub, float)
    lp.row_lower_, lp.row_upper_ = np.asarray(row_lo, float), np.asarray(row_hi, float)
    lp.a_matrix_.format_ = _core.MatrixFormat.kColwise
    lp.a_matrix_.num_col_, lp.a_matrix_.num_row_ = n, m
    lp.a_matrix_.start_, lp.a_matrix_.index_, lp.a_matrix_.value_ = a.indptr, a.indices, a.data
    kinds = (_core.HighsVarType.kContinuous, _core.HighsVarType.kInteger)
    lp.integrality_ = [kinds[int(k)] for k in np.asarray(integrality)]
    h = _core._Highs()
    h.setOptionValue("output_flag", False)
    if h.passModel(lp) == _core.HighsStatus.kError:
        raise TesseraError(f"HiGHS refused the MILP ({n} variables, {m} rows) for {path}")
    if h.writeModel(str(path)) == _core.HighsStatus.kError:
        raise TesseraError(f"HiGHS could not write {path}")
