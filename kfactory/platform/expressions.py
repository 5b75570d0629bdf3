"""The expressions of specs and launch rules: arithmetic, comparisons and a few functions over named values,
evaluated by simpleeval (no attribute access, no imports, no calls but FUNCTIONS).

One evaluator for a problem's constraints and costs (kfactory.problems.package.safe_eval) and a cuda kernel's
launch rule (kfactory.targets.cuda.launch), in a module that imports nothing of kfactory's: the cuda runner child
evaluates launch rules and must not pull in the problem loader.
"""
from __future__ import annotations

import functools
import math
import threading
from typing import Any

from simpleeval import EvalWithCompoundTypes, InvalidExpression, SimpleEval


def cdiv(a, b):
    """Ceiling division: the number of blocks of size b that cover a."""
    if isinstance(a, int) and isinstance(b, int):
        return -(-a // b)
    return math.ceil(a / b)


#: the functions an expression may call
FUNCTIONS = {"min": min, "max": max, "abs": abs, "ceil": math.ceil, "cdiv": cdiv}


@functools.lru_cache(maxsize=4096)
def _parsed(expr: str) -> Any:  # simpleeval's parsed node
    # a family's constraints are evaluated at every point of its space (86,000 evaluations to list softmax's):
    # parsing each expression once, and one evaluator a thread, took the descent strategy's start on softmax
    # (which lists them) from 6.8 s to 1.3 s
    return SimpleEval.parse(expr)


_evaluators = threading.local()


def _evaluator() -> EvalWithCompoundTypes:
    """This thread's evaluator (building one costs as much as evaluating a constraint, so each thread keeps its
    own and sets its names for each expression)."""
    ev = getattr(_evaluators, "ev", None)
    if ev is None:
        ev = _evaluators.ev = EvalWithCompoundTypes(functions=dict(FUNCTIONS))
    return ev


#: what evaluating an expression raises when the expression (not kfactory) is at fault: simpleeval's refusals,
#: a syntax error, a wrong type, a division by zero or an overflow (10.0 ** 400), a math domain error
ERRORS = (InvalidExpression, SyntaxError, TypeError, ArithmeticError, ValueError)


def evaluate(expr: str, names: dict) -> Any:  # what the expression computes: a number, a bool, a tuple
    """The value of `expr` over `names`, raising one of ERRORS when the expression cannot be evaluated; callers
    say which expression of theirs failed."""
    ev = _evaluator()
    ev.names = names
    return ev.eval(expr, _parsed(expr))
