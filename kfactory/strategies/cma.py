"""CMA-ES through Optuna's ask-and-tell API (CmaEsSampler, with margin for integer coordinates; needs the
`cmaes` package). It suits spaces whose parameters are ordered numbers, as kernel tuning spaces mostly are: each
such parameter is searched as the position of its value in sorted order (tpe.py's `ordinal` encoding); any
other parameter is drawn independently at random.

It starts with `design` uniformly drawn points, then starts CMA-ES from what they found: a warm-started CMA-ES
(Optuna's `source_trials`, WS-CMA-ES) whose first mean and covariance come from the best of every result so far.
Optuna's default start, the middle of every range, is a slow region of some spaces (convolution on the MI250X:
10x the optimum after 25 evaluations). Warm-started (evidence from other campaigns of this space), it skips
the design and starts CMA-ES from the best of that evidence instead. From then on it learns only from the
points it asked itself: CMA-ES updates one generation of its own samples at a time, so in a portfolio it is a
member that keeps its own course."""
from __future__ import annotations

import math
import warnings
from collections.abc import Sequence

import optuna

from kfactory.strategies.base import Point, Space, Strategy
from kfactory.strategies.options import Option
from kfactory.strategies.tpe import OPTIONS as OPTUNA_OPTIONS
from kfactory.strategies.tpe import OptunaSearch

#: the design's size, and the Optuna search's options that apply here (the design samples at random, and ordered
#: parameters are always positions: what CMA-ES models)
OPTIONS: dict[str, Option] = {
    "design": Option("uniformly drawn points before CMA-ES starts from the best of them", 10, int, low=1),
    **{k: OPTUNA_OPTIONS[k] for k in ("tries", "penalty", "keep")},
}


class CmaSearch(OptunaSearch):
    def __init__(self, space: Space, seed: int, design: int = 10, **options):
        super().__init__(space, seed, **{"sampler": "random", **options, "ordinal": True})
        self.design, self.seed = design, seed
        self.centred = False

    def warm(self, evidence: list) -> None:
        """Other campaigns' measurements of this space's points take the random design's place: CMA-ES starts
        at once from the best of them (WS-CMA-ES's use: a similar task's results give the first mean and
        covariance). Evidence that comes after the design has started CMA-ES is not used."""
        source = [(e.point, math.log(e.relative)) for e in evidence
                  if e.relative > 0 and math.isfinite(e.relative) and self.space.valid(e.point)]
        if len(source) >= self.design and not self.centred:
            self._centre(source)

    def _next(self) -> Point | None:
        if not self.centred and sum(s is not None for s in self.results.values()) >= self.design:
            self._centre()
        return super()._next()

    def _centre(self, evidence: Sequence[tuple[Point, float]] = ()) -> None:
        """Replace the design's random study by CMA-ES warm-started from every result so far, or from `evidence`
        ((point, log relative score) from other campaigns) when given; points still in flight are told to the
        new study as fixed trials when their results come (CMA-ES does not learn from them). Without ordinal
        parameters there is nothing for CMA-ES to model, and the search stays random."""
        self.centred = True
        dists = {k: self.dists[k] for k in self.ordinal}
        if evidence:  # relative scores, on their own scale: not mixed with this campaign's seconds
            measured = [(self._dist_params(p), value) for p, value in evidence]
        else:
            measured = [(self._dist_params(p), value) for p, value in self.values.items()
                        if self.results.get(p) is not None]  # failures carry a penalty, not a measurement
        source = [optuna.trial.create_trial(params={k: params[k] for k in dists}, distributions=dists, value=value)
                  for params, value in measured]
        if not self.ordinal or not source:
            return
        with warnings.catch_warnings():  # source_trials and with_margin are marked experimental
            warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
            self.sampler = optuna.samplers.CmaEsSampler(source_trials=source, seed=self.seed % 2 ** 32,
                                                        n_startup_trials=0, with_margin=True,
                                                        warn_independent_sampling=False)
        self.study = optuna.create_study(direction="minimize", sampler=self.sampler)
        self.trials.clear()
        self.in_study = 0


def make(space: Space, seed: int, **options) -> Strategy:
    """CMA-ES (with margin) after a random design; options as in OPTIONS."""
    return CmaSearch(space, seed, **options)
