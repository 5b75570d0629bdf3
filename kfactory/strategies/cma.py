"""CMA-ES through Optuna's ask-and-tell API (CmaEsSampler, with margin for integer coordinates; needs the
`cmaes` package). It suits spaces whose parameters are ordered numbers, as kernel tuning spaces mostly are: each
such parameter is searched as the position of its value in sorted order (tpe.py's `ordinal` encoding); any
other parameter is drawn independently at random. It learns only from the points it asked itself (CMA-ES
updates one generation of its own samples at a time), so in a portfolio it is a member that keeps its own
course."""
from kfactory.strategies.base import Space, Strategy
from kfactory.strategies.tpe import OptunaSearch


def make(space: Space, seed: int, **options) -> Strategy:
    return OptunaSearch(space, seed, **{"sampler": "cmaes", "ordinal": True, "startup": 1, **options})
