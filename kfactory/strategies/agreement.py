"""How far each source of a warm start can be trusted, measured on this campaign's own results as they arrive.

A source is an earlier campaign (another device, another shape) whose measurements a warm start learns from;
transfer.PriorMean predicts its log(relative score) at every point of this space. After each result, each
source is judged on the points measured here so far:

- **Agreement**: Kendall's tau between the source's predictions and this device's measured times over every
  pair of measured points (1: it orders them as this device does; 0: no better than chance; -1: upside down),
  with a 90% interval from resampling the measured points (bootstrap). A handful of points gives a wide
  interval: that is the uncertainty, and the weights below carry it.
- **Weight**: ranking against this device's own model (as in Feurer, Letham and Bakshy, "Scalable meta-learning
  for Bayesian optimization using ranking-weighted Gaussian process ensembles", 2018). The own model is a GP
  fitted to the results here that predicts each measured point without it (leave-one-out; a constant, which
  orders nothing, before three results). In each bootstrap resample of the measured points, a source beats the
  own model when it misorders fewer pairs; P, the share of resamples it beats it in, carries the uncertainty
  (a handful of points: P near a half). Its margin is max(0, 2P - 1): 0 for a source no better than the own
  model, 1 for one better in every resample. The evidence's say is the best source's margin, shared among the
  sources by their margins, and the own model has the rest. So an agreeing source gains weight, an unrelated or
  upside-down one loses it, several sources no better than chance have no say together (a winner-takes-the-
  resample share would give k of them k/(k+1) of it by luck), and as results accumulate the own model orders
  them better and the evidence's say shrinks on its own.
- Before two results there is nothing to judge: the sources share the whole weight equally (a warm start was
  asked for, and the evidence is all there is).

The weights and the say (`Trust.evidence`, the sources' total weight) act everywhere the evidence does: the
prior mean combines the sources by their weights and is scaled by the say (transfer.PriorMean.fit); the
evidence's points proposed first are chosen by the weights, and stop once every source confidently orders this
device's results against it (transfer.WarmPriors); the default portfolio gives its evidence-led member the say's
share of its asks (portfolio.py).
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from kfactory.strategies.encoding import fit_subset

#: bootstrap resamples of the measured points per judgement
SAMPLES = 256
#: the most measured points a judgement compares (the best half and a spread of the rest): pairs grow as the
#: square, and a few hundred pairs per model already settle the weights
MAX_ROWS = 128
#: results between fits of the own model's hyperparameters (its GP is refitted on every judgement)
REFIT = 8
#: results judged before the planner may stop proposing the evidence's points first (transfer.WarmPriors): on
#: fewer, a handful of near-equal points of the sources' best ordered against them by chance looks confident
PRIORS_JUDGED = 5


@dataclass(frozen=True)
class SourceAgreement:
    """One source, judged on this campaign's results: Kendall's tau with its 90% interval, and its weight."""
    source: str
    tau: float | None
    low: float | None
    high: float | None
    weight: float

    def as_dict(self) -> dict:
        return {"source": self.source, "agreement": _r3(self.tau), "interval_90": [_r3(self.low), _r3(self.high)],
                "weight": round(self.weight, 3)}


@dataclass(frozen=True)
class Trust:
    """Every source's agreement and weight after `results` measured results, and the own model's weight."""
    results: int
    sources: tuple[SourceAgreement, ...]
    own: float
    own_tau: float | None = None

    @property
    def evidence(self) -> float:
        """The sources' total weight: how much say the other campaigns' evidence has now (0 to 1)."""
        return float(sum(s.weight for s in self.sources))

    def weights(self) -> np.ndarray:
        return np.array([s.weight for s in self.sources])

    @classmethod
    def equal(cls, sources: list[str], results: int = 0) -> Trust:
        """Nothing measured to judge by: every source has the same say, and together all of it."""
        k = max(len(sources), 1)
        return cls(results, tuple(SourceAgreement(s, None, None, None, 1.0 / k) for s in sources), 0.0)


def _r3(v: float | None) -> float | None:
    return None if v is None else round(v, 3)


def pair_losses(preds: np.ndarray, y: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(D, E): D[m] is model m's misordered-pair matrix over the measured points (1 where its predictions order
    a pair against the measurements, 1/2 where it predicts a tie the measurements break), E the pairs the
    measurements order (ties in the measurements compare nothing)."""
    dy = np.sign(y[:, None] - y[None, :])
    E = (dy != 0).astype(float)
    dp = np.sign(preds[:, :, None] - preds[:, None, :])
    D = ((dp * dy[None]) < 0).astype(float) + 0.5 * ((dp == 0) & (dy != 0)[None])
    return D, E


def judge(preds: np.ndarray, own: np.ndarray, y: np.ndarray, names: list[str], rng: np.random.Generator,
          samples: int = SAMPLES) -> Trust:
    """The Trust of the module docstring. `preds`: each source's predictions at the measured points (k x n),
    `own`: the own model's leave-one-out predictions there (n), `y`: the measured log-times (n)."""
    n, k = len(y), len(names)
    D, E = pair_losses(np.vstack([preds, own[None, :]]), y)
    if n < 2 or E.sum() == 0:
        return Trust.equal(names, n)
    tau = 1.0 - 2.0 * D.sum(axis=(1, 2)) / E.sum()
    C = rng.multinomial(n, np.full(n, 1.0 / n), size=samples).astype(float)  # resampled points' counts
    pairs = ((C @ E) * C).sum(axis=1)
    loss = ((C[None] @ D) * C[None]).sum(axis=2)  # misordered pairs per model and resample
    ok = pairs > 0  # a resample of copies of one point compares nothing
    if not ok.any():
        return Trust.equal(names, n)
    loss, pairs = loss[:, ok], pairs[ok]
    low, high = np.quantile(1.0 - 2.0 * loss / pairs, [0.05, 0.95], axis=1)
    # each source against the own model, resample by resample: how often it misorders fewer pairs (ties half)
    beats = ((loss[:k] < loss[k][None]) + 0.5 * (loss[:k] == loss[k][None])).mean(axis=1)
    # a source has a say only insofar as it beats the own model more often than not: one no better than the own
    # model (or than chance, while the own model knows nothing) has none, however many such sources there are
    margin = np.clip(2.0 * beats - 1.0, 0.0, 1.0)
    say = float(margin.max())
    weight = say * margin / margin.sum() if say > 0 else np.zeros(k)
    return Trust(n, tuple(SourceAgreement(names[s], float(tau[s]), float(low[s]), float(high[s]), float(weight[s]))
                          for s in range(k)), 1.0 - say, float(tau[k]))


class SourceTrust:
    """A campaign's running judgement of its sources (the module docstring), recomputed whenever a result has
    come in since the last one. `M`: each source's predicted log(relative score) at every point of the index
    (transfer.PriorMean.M); `gp_factory(d)` makes the own model's GP (surrogate.GP)."""

    def __init__(self, M: np.ndarray, names: list[str], X: np.ndarray, gp_factory, seed: int = 0):
        self.M, self.names, self.X = M, list(names), X
        self.gp = gp_factory(X.shape[1])
        self.rng = np.random.default_rng(seed)
        self._last_hyper = -REFIT
        self._cached: tuple[int, Trust] | None = None
        self.history: list[tuple[int, float]] = []  # (results, the evidence's say) at each judgement

    def __call__(self, rows: np.ndarray, y: np.ndarray) -> Trust:
        """The Trust after these results: `rows` index the measured points (failures excluded), `y` their
        log-times."""
        n = len(rows)
        if self._cached is not None and self._cached[0] == n:
            return self._cached[1]
        if len(y) > MAX_ROWS:
            keep = fit_subset(y, MAX_ROWS)
            rows, y = rows[keep], y[keep]
        trust = judge(self.M[:, rows], self._loo(rows, y, n), y, self.names, self.rng) if n >= 2 \
            else Trust.equal(self.names, n)
        trust = Trust(n, trust.sources, trust.own, trust.own_tau)
        self._cached = (n, trust)
        self.history.append((n, trust.evidence))
        return trust

    def _loo(self, rows: np.ndarray, y: np.ndarray, results: int) -> np.ndarray:
        """The own model's leave-one-out prediction at each measured point (closed form: y_i - alpha_i /
        [K^-1]_ii); a constant, which orders nothing, while there are too few results to fit a GP. Its
        hyperparameters are refitted every REFIT of the campaign's `results`."""
        if len(y) < 3 or np.ptp(y) == 0:
            return np.zeros(len(y))
        ys = (y - y.mean()) / y.std()
        X = self.X[rows]
        if results - self._last_hyper >= REFIT:
            self.gp.fit_hyper(X, ys, maxiter=15)
            self._last_hyper = results
        try:
            self.gp.fit(X, ys)
        except np.linalg.LinAlgError:
            return np.zeros(len(y))
        from scipy.linalg import cho_solve   # here: scipy.linalg is 0.4 s of the planner's start, used only here

        kinv = cho_solve((self.gp.L, True), np.eye(len(y)), check_finite=False)
        return ys - self.gp.alpha / np.diag(kinv)


def finite_log_times(results: dict, pos: dict) -> tuple[np.ndarray, np.ndarray]:
    """(rows, log-times) of a strategy's successful results that are in the index (failures rank nothing)."""
    rows, ys = [], []
    for p, s in results.items():
        i = pos.get(p)
        if i is not None and s is not None and s > 0 and math.isfinite(s):
            rows.append(i)
            ys.append(math.log(s))
    return np.array(rows, dtype=np.int64), np.array(ys)
