"""Refit the planner's cluster on the trials it predicted: predict, run, check, refit.

Three factors, fitted by robust least squares (soft L1) on log(predicted / measured) step time over the completed
trials (scipy.optimize.least_squares): one on the compute (forward, backward, optimizer), one on each link level's
seconds per byte. Three numbers against a dozen or more trials of different strategies and compressors: the fit
cannot follow each trial, and `held_out` says how well it predicts a trial it was not fitted on.
"""

import dataclasses
import statistics

import numpy as np
from scipy.optimize import least_squares

ROBUST = 0.2  # log-residuals past ~20% count linearly, not squared: a trial the model cannot describe (PowerSGD
# still in its uncompressed start_step steps, predicted compressed) must not drag the factors for every other one
BOUND = np.log(20.0)  # no factor beyond 20x either way: past that the model, not its constants, is wrong


def scaled(cl, compute: dict, x) -> tuple:
    """(cluster, compute) with the factors exp(x) = (compute, intra beta, inter beta) applied."""
    f = np.exp(x)
    levels = {lv: dataclasses.replace(getattr(cl, lv), beta_s_per_byte=getattr(cl, lv).beta_s_per_byte * k)
              for lv, k in (("intra", f[1]), ("inter", f[2]))}
    return dataclasses.replace(cl, **levels), {k: v * f[0] for k, v in compute.items()}


def errors(points, cl, compute, predict, x=None) -> list:
    """|predicted / measured - 1| per (cfg, measured step seconds) point, at factors exp(x) (None: none)."""
    c, comp = scaled(cl, compute, np.zeros(3) if x is None else x)
    return [abs(predict(cfg, c, comp) / m - 1) for cfg, m in points]


def fit(points, cl, compute, predict) -> np.ndarray:
    def residuals(x):
        c, comp = scaled(cl, compute, x)
        return [np.log(predict(cfg, c, comp) / m) for cfg, m in points]

    return least_squares(residuals, np.zeros(3), bounds=(-BOUND, BOUND), diff_step=1e-3, loss="soft_l1",
                         f_scale=ROBUST).x


def refit(points, cl, compute, predict, keys=None) -> dict:
    """The factors, the refitted cluster and compute, and the median error before, after (fitted on every point)
    and held out: each point predicted by a fit on the points of the other candidates (`keys`: each point's
    candidate; None: each point its own), so that a candidate's other rung does not predict it; None where fewer
    than 4 points, or than 3 others, are left to fit."""
    keys = list(range(len(points))) if keys is None else keys
    x = fit(points, cl, compute, predict)
    rest = [[q for q, k in zip(points, keys, strict=True) if k != key] for key in keys]
    held = [errors([p], cl, compute, predict, fit(others, cl, compute, predict))[0]
            for p, others in zip(points, rest, strict=True)] if min(map(len, rest), default=0) >= 3 else None
    new_cl, new_compute = scaled(cl, compute, x)
    return {"factors": dict(zip(("compute", "intra_beta", "inter_beta"), np.exp(x).tolist(), strict=True)),
            "before": statistics.median(errors(points, cl, compute, predict)),
            "after": statistics.median(errors(points, cl, compute, predict, x)),
            "held_out": statistics.median(held) if held else None, "held_out_each": held, "cluster": new_cl,
            "compute": new_compute}
