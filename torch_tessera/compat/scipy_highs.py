"""The HiGHS that SciPy bundles, called directly: writing a MILP as an MPS file, and solving one.

Why here: ``scipy.optimize.milp`` solves with HiGHS but has no public way to export the model; SciPy's private
``scipy.optimize._highspy._core`` binds HiGHS' ``Highs.passModel`` / ``writeModel``. Solving: ``milp``'s Python
wrapper costs about as much as HiGHS itself on the scheduler's small models (it builds HiGHS' option manager once per
option and loops in Python over every column for bound marginals the scheduler does not read; docs/BENCHMARKS.md,
solver constants), so :func:`solve` passes the same model and options to the same HiGHS and reads back only the
solution, the objective and the MIP statistics. Checked on SciPy 1.17.1. Anything else touching SciPy internals
belongs in this module.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

import numpy as np
from scipy.sparse import csc_matrix, spmatrix

from torch_tessera.errors import TesseraError


@dataclass
class HighsResult:
    """What :func:`solve` reads back, in ``scipy.optimize.milp``'s terms.

    Attributes:
        status: 0 optimal, 1 time or iteration limit, 2 infeasible, 3 unbounded, 4 other (``milp``'s codes).
        x: the solution ``[n]`` (``None`` when HiGHS has none: an LP that is not optimal, a MILP without incumbent).
        fun: its objective value (``None`` with ``x``).
        mip_dual_bound / mip_node_count: HiGHS' dual bound and branch-and-bound nodes (``None`` for an LP, and
            without a solution).
    """

    status: int
    x: np.ndarray | None
    fun: float | None
    mip_dual_bound: float | None = None
    mip_node_count: int | None = None


def _highs_lp(core, c, integrality: np.ndarray | None, lb, ub, A: spmatrix, row_lo, row_hi):
    """``(HighsLp, n, m)`` of the model :func:`solve` and :func:`write_mps` take (column-wise matrix; integrality
    set when given: 0 continuous, nonzero integer)."""
    a = csc_matrix(A)
    n, m = a.shape[1], a.shape[0]
    lp = core.HighsLp()
    lp.num_col_, lp.num_row_ = n, m
    lp.col_cost_ = np.asarray(c, float)
    lp.col_lower_, lp.col_upper_ = np.asarray(lb, float), np.asarray(ub, float)
    lp.row_lower_, lp.row_upper_ = np.asarray(row_lo, float), np.asarray(row_hi, float)
    lp.a_matrix_.format_ = core.MatrixFormat.kColwise
    lp.a_matrix_.num_col_, lp.a_matrix_.num_row_ = n, m
    lp.a_matrix_.start_, lp.a_matrix_.index_, lp.a_matrix_.value_ = a.indptr, a.indices, a.data.astype(float)
    if integrality is not None:
        kinds = (core.HighsVarType.kContinuous, core.HighsVarType.kInteger)
        lp.integrality_ = [kinds[k] for k in (integrality != 0).astype(np.int64).tolist()]
    return lp, n, m


def solve(c: np.ndarray, integrality: np.ndarray, lb: np.ndarray, ub: np.ndarray, A: spmatrix, row_lo: np.ndarray,
          row_hi: np.ndarray, options: dict) -> HighsResult:
    """Solve ``min c.x  s.t.  row_lo <= A x <= row_hi,  lb <= x <= ub,  x_j integer where integrality_j == 1`` with
    SciPy's HiGHS, as ``scipy.optimize.milp(c, integrality=..., bounds=Bounds(lb, ub),
    constraints=LinearConstraint(A, row_lo, row_hi), options=options)`` does (same model, same options, same
    statuses), without its per-column Python work.

    Args:
        c, integrality, lb, ub, A, row_lo, row_hi: as :func:`write_mps` (all integrality 0: an LP).
        options: HiGHS option name -> value (``presolve`` as a bool, as ``milp`` takes it; ``time_limit`` seconds,
            ``mip_rel_gap``, ``objective_bound``...).

    Raises:
        TesseraError: this SciPy has no bundled HiGHS binding, or HiGHS refused an option or the model.
    """
    try:
        from scipy.optimize._highspy import _core
    except ImportError as e:  # pragma: no cover - depends on the SciPy build
        raise TesseraError(f"cannot call HiGHS: this SciPy has no bundled HiGHS binding ({e})") from e
    integrality = np.asarray(integrality)
    mip = bool(integrality.any())
    lp, n, m = _highs_lp(_core, c, integrality if mip else None, lb, ub, A, row_lo, row_hi)
    h = _core._Highs()
    h.setOptionValue("output_flag", False)
    for key, val in options.items():
        if key == "presolve":
            val = "on" if val else "off"
        if h.setOptionValue(key, val) == _core.HighsStatus.kError:
            raise TesseraError(f"HiGHS refused option {key}={val!r}")
    if h.passModel(lp) == _core.HighsStatus.kError:
        raise TesseraError(f"HiGHS refused the model ({n} variables, {m} rows)")
    h.run()
    status = h.getModelStatus()
    info = h.getInfo()
    S = _core.HighsModelStatus
    code = {S.kOptimal: 0, S.kTimeLimit: 1, S.kIterationLimit: 1, S.kInfeasible: 2, S.kModelError: 2,
            S.kUnbounded: 3}.get(status, 4)
    if mip:
        has = status in (S.kOptimal, S.kTimeLimit, S.kIterationLimit, S.kSolutionLimit) and \
            info.objective_function_value != _core.kHighsInf
    else:
        has = status == S.kOptimal
    if not has:  # as milp: no solution, no statistics
        return HighsResult(code, None, None)
    return HighsResult(code, np.array(h.getSolution().col_value), float(info.objective_function_value),
                       float(info.mip_dual_bound) if mip else None, int(info.mip_node_count) if mip else None)


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
    lp, n, m = _highs_lp(_core, c, np.asarray(integrality), lb, ub, A, row_lo, row_hi)
    h = _core._Highs()
    h.setOptionValue("output_flag", False)
    if h.passModel(lp) == _core.HighsStatus.kError:
        raise TesseraError(f"HiGHS refused the MILP ({n} variables, {m} rows) for {path}")
    if h.writeModel(str(path)) == _core.HighsStatus.kError:
        raise TesseraError(f"HiGHS could not write {path}")
