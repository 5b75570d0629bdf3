"""Problem packages: a spec (problem.yaml), a reference module (reference.py) and families.

Built-in problems live beside this file; a user's package is any directory with the same layout.
"""
from kfactory.problems.loader import (BUILTIN_DIR, Family, NoSuchProblem, Problem, ProblemError, list_problems,
                                      load_problem)

__all__ = ["BUILTIN_DIR", "Family", "NoSuchProblem", "Problem", "ProblemError", "list_problems", "load_problem"]
