"""A loaded problem package: the Problem, its Families (enumerating, validating and rendering design points), the
expression evaluator their specs use, and ProblemError.

Reading a package from disk is kfactory.problems.loader's; this module imports nothing of kfactory beyond the spec,
so whatever builds a problem another way (the replay target's recorded spaces) can use it without the loader.
"""
from __future__ import annotations

import ast
import functools
import importlib.util
import itertools
import random
import traceback
from dataclasses import dataclass, field
from functools import cached_property
from pathlib import Path
from types import ModuleType
from typing import Any, ClassVar

import jinja2
import jinja2.meta

from kfactory.platform.expressions import ERRORS as EXPRESSION_ERRORS, FUNCTIONS, evaluate
from kfactory.problems.spec import FamilySpec, ProblemSpec

#: where the built-in problem packages are (kfactory/problems/NAME)
BUILTIN_DIR = Path(__file__).parent

#: a source file's language from its suffix
LANGUAGES = {".c": "c", ".cc": "cpp", ".cpp": "cpp", ".cxx": "cpp", ".c++": "cpp", ".cu": "cuda", ".ptx": "ptx"}
#: suffixes whose case decides, as gcc reads them: .C is C++
CASED_LANGUAGES = {".C": "cpp"}


def language_of(path: Path | str, target: str) -> str:
    """The language of a source file by its suffix (.c, .cpp, .cu, .ptx); unknown suffixes get the target's
    usual language."""
    suffix = Path(path).suffix
    return CASED_LANGUAGES.get(suffix) or LANGUAGES.get(suffix.lower(), "cuda" if target.startswith("cuda") else "c")


class ProblemError(ValueError):
    """A problem package is missing, malformed or inconsistent; the message says what to fix."""


class NoSuchProblem(ProblemError):
    """The name is no built-in problem and the path no directory with a problem.yaml: a mistyped name, not a
    package that fails to load."""


def safe_eval(expr: str, names: dict) -> Any:  # what the expression computes: a number, a bool, a tuple
    """The value of a spec expression (a constraint, a cost, a launch rule's threads) over `names`: arithmetic,
    comparisons and FUNCTIONS only; ProblemError names the expression when it cannot be evaluated."""
    try:
        return evaluate(expr, names)
    except EXPRESSION_ERRORS as e:
        raise ProblemError(f"cannot evaluate {expr!r} with {names}: {e}") from e


def _read_source(path: Path, field_name: str) -> str:
    """A kernel source problem.yaml names; ProblemError naming the field when it cannot be read."""
    try:
        return path.read_text()
    except (OSError, UnicodeDecodeError) as e:
        raise ProblemError(f"{path.parent / 'problem.yaml'}: {field_name}: cannot read {path.name}: "
                           f"{getattr(e, 'strerror', None) or e}") from e


def expression_names(expr: str) -> set[str]:
    """The names a spec expression reads (SyntaxError when it is not one)."""
    return {n.id for n in ast.walk(ast.parse(expr.strip(), mode="eval")) if isinstance(n, ast.Name)}


def _where(e: jinja2.TemplateError, default: Path) -> str:
    """file:line of a template error (a syntax error knows its line; a render error's is in its traceback)."""
    line = getattr(e, "lineno", None)
    if line is None:
        frames = [f for f in traceback.extract_tb(e.__traceback__) if f.filename == str(default)]
        line = frames[-1].lineno if frames else None
    return f"{getattr(e, 'filename', None) or default}:{line}" if line else str(default)


def _what(e: jinja2.TemplateError) -> str:
    return getattr(e, "message", None) or str(e)


def _free_names(tree: jinja2.nodes.Template) -> set[str]:
    """The names a template reads from its context. Jinja's own analysis counts a macro (or {% set %}) defined
    inside an {% if %} as undeclared where it is used; any name the template binds somewhere (a macro, its
    arguments, a set or loop target) is taken as its own instead, so a valid template is never refused."""
    bound = {n.name for n in tree.find_all(jinja2.nodes.Macro)}
    bound |= {n.name for n in tree.find_all(jinja2.nodes.Name) if n.ctx in ("store", "param")}
    return jinja2.meta.find_undeclared_variables(tree) - bound


@functools.lru_cache(maxsize=256)
def _template_names(path: str, mtime_ns: int, size: int) -> frozenset[str]:
    """_free_names of a template file, parsed once per version of the file (a problem loads many times in a
    process: every submit, check and coder request)."""
    return frozenset(_free_names(jinja2.Environment().parse(Path(path).read_text())))


def import_file(name: str, path: Path) -> ModuleType:
    """A Python file (a problem's reference.py) imported as the module `name`: references are files in a package
    directory, not modules on the import path."""
    spec = importlib.util.spec_from_file_location(name, path)
    if spec is None or spec.loader is None:
        raise ProblemError(f"{path}: cannot be imported as a Python module")
    mod = importlib.util.module_from_spec(spec)
    try:
        spec.loader.exec_module(mod)
    except SystemExit as e:   # not an Exception: it would end the service (or the command) without a word
        raise ProblemError(f"{path}: importing it called sys.exit({e.code!r}); a problem's file must define "
                           "functions, not end the program") from e
    return mod


def shape_str(shape: dict[str, int], symbols: list[str]) -> str:
    """'4096x4096' in symbol order."""
    return "x".join(str(shape[s]) for s in symbols)


@dataclass
class Family:
    """A way to implement a problem on a target: a template, a design space and a launch rule."""
    spec: FamilySpec
    directory: Path
    #: the problem's scalar parameters (name -> value): Jinja variables of the template and compile_flags beside
    #: the design point's own (kfactory.problems.params)
    problem_params: dict = field(default_factory=dict)

    @property
    def name(self) -> str:
        return self.spec.name

    @cached_property
    def _env(self) -> jinja2.Environment:
        return jinja2.Environment(loader=jinja2.FileSystemLoader(self.directory), undefined=jinja2.StrictUndefined,
                                  keep_trailing_newline=True)

    @cached_property
    def _template(self) -> jinja2.Template:
        return self._env.get_template(self.spec.template)

    def check_names(self) -> None:
        """ProblemError (file:line) when the template or compile_flags uses a name that is neither a parameter
        of the family nor a param of the problem: StrictUndefined would raise only on a path a point renders,
        so a misspelt name in a rarely taken branch is caught here, when the package loads. A template that
        cannot be read or parsed is left to render and `problems check`, which report it with its line."""
        known = set(self.spec.params) | set(self.problem_params) | set(self._env.globals)
        path = self.directory / self.spec.template
        try:
            st = path.stat()
            used = _template_names(str(path), st.st_mtime_ns, st.st_size)
        except (OSError, UnicodeDecodeError, jinja2.TemplateError):
            used = frozenset()
        if unknown := sorted(used - known):
            line = next((n for n, tok, value in self._env.lex(path.read_text())
                         if tok == "name" and value == unknown[0]), None)
            raise ProblemError(f"{path}:{line}: family {self.name}: the template uses {unknown[0]!r}, which is "
                               f"{self._neither()}")
        try:
            used = frozenset(_free_names(jinja2.Environment().parse(self.spec.compile_flags)))
        except jinja2.TemplateError:
            used = frozenset()
        if unknown := sorted(used - known):
            raise ProblemError(f"{self.directory / 'family.yaml'}: compile_flags of family {self.name} uses "
                               f"{unknown[0]!r}, which is {self._neither()}")
        # constraints and the threads rule see the point's parameters only; checked whole here, since evaluating
        # them at points skips what short-circuits (`a or widht > 0`) and the first point may never reach it
        exprs = [(f"constraints[{i}]", c) for i, c in enumerate(self.spec.constraints)]
        exprs += [("launch.threads", self.spec.launch["threads"])] if "threads" in self.spec.launch else []
        for where, expr in exprs:
            try:
                names = expression_names(expr)
            except SyntaxError as e:
                raise ProblemError(f"{self.directory / 'family.yaml'}: {where} of family {self.name}: {expr!r} is "
                                   f"not an expression ({e.msg})") from e
            if unknown := sorted(names - set(self.spec.params) - set(FUNCTIONS) - {"True", "False"}):
                raise ProblemError(f"{self.directory / 'family.yaml'}: {where} of family {self.name}: {expr!r} "
                                   f"uses {unknown[0]!r}, which is not a parameter of the family "
                                   f"({', '.join(self.spec.params)})")

    def _neither(self) -> str:
        return (f"neither a parameter of the family ({', '.join(self.spec.params)}) nor a param of the problem "
                f"({', '.join(self.problem_params) or 'it declares none'})")

    def valid(self, params: dict) -> bool:
        """True when params gives every parameter one of its values and satisfies every constraint."""
        if set(params) != set(self.spec.params):
            return False
        if any(params[k] not in vals for k, vals in self.spec.params.items()):
            return False
        try:
            return all(bool(safe_eval(c, params)) for c in self.spec.constraints)
        except ProblemError as e:
            raise ProblemError(f"{self.directory / 'family.yaml'}: constraints of family {self.name}: {e}") from e

    def points(self) -> list[dict]:
        """Every valid design point, in a fixed order."""
        return list(self._valid_points())

    def first_point(self) -> dict | None:
        """The first valid design point of points()' order, found without enumerating the rest (None: none)."""
        return next(self._valid_points(), None)

    def _valid_points(self):
        keys = list(self.spec.params)
        combos = (dict(zip(keys, vals)) for vals in itertools.product(*(self.spec.params[k] for k in keys)))
        return (p for p in combos if self.valid(p))

    def random_point(self, rng: random.Random, tries: int = 1000) -> dict:
        """A uniformly drawn valid point (rejection sampling)."""
        for _ in range(tries):
            p = {k: rng.choice(v) for k, v in self.spec.params.items()}
            if self.valid(p):
                return p
        raise ProblemError(f"family {self.name}: no valid point in {tries} random draws; check the constraints")

    def render(self, params: dict) -> tuple[str, str, int]:
        """(source, compile flags, threads) at a design point; a template error names its file and line."""
        names = {**self.problem_params, **params}
        try:
            source = self._template.render(**names)
        except jinja2.TemplateError as e:
            raise ProblemError(f"{_where(e, self.directory / self.spec.template)}: family {self.name}: template "
                               f"failed at {params}: {_what(e)}") from e
        except UnicodeDecodeError as e:   # (jinja2 reads the template on first use)
            raise ProblemError(f"{self.directory / self.spec.template}: not UTF-8 text (byte {e.start}: "
                               f"{e.reason}); save it as UTF-8") from e
        try:
            flags = jinja2.Template(self.spec.compile_flags, undefined=jinja2.StrictUndefined).render(**names)
        except jinja2.TemplateError as e:
            raise ProblemError(f"{self.directory / 'family.yaml'}: compile_flags of family {self.name} failed at "
                               f"{params}: {_what(e)}") from e
        return source, " ".join(flags.split()), self.threads_at(params)

    def threads_at(self, params: dict) -> int:
        """The threads a point's kernel runs (its launch rule's `threads`; 1 without one)."""
        return int(safe_eval(self.spec.launch.get("threads", "1"), params))

    def launch_rule(self, params: dict) -> dict | None:
        """A cuda family's launch rule at a point: grid/block/smem expressions over the params and the
        shape symbols, evaluated per call by kfactory.targets.cuda.launch; None for families without one."""
        rule = {k: v for k, v in self.spec.launch.items() if k in ("grid", "block", "smem")}
        return {**rule, "params": params} if rule else None


def lowest_score(measured: list) -> Any:
    """The Measured event of `measured` (non-empty) with the lowest score: a kernel campaign's result."""
    return min(measured, key=lambda m: m.score_s)


@dataclass
class Problem:
    """A loaded problem package."""
    spec: ProblemSpec
    directory: Path
    families: dict[str, Family] = field(default_factory=dict)
    #: what a candidate of the problem is: "kernel" (judged by kfactory.judge), or "engine" (a whole inference
    #: engine, kfactory.engines.problem: the stages hand it to kfactory.engines.stages)
    kind: ClassVar[str] = "kernel"
    @property
    def reference_in_package(self) -> bool:
        """Whether reference() is its author's code, a user's package's reference.py: checked in a child process
        under a time limit before a campaign (kfactory/problems/refcheck.py). kfactory's own references (the
        built-in packages', kfactory/problems/NAME; a replayed space's) are checked in this process: they are the
        project's tested code, and a child costs every campaign's submit ~0.5 s."""
        return self.directory.resolve().parent != BUILTIN_DIR.resolve()

    def checks_itself(self) -> list[str] | None:
        """Problems found by the problem's own rule ([] when fit to run), or None: the kernel checks apply
        (kfactory.problems.check: run the reference, render every family)."""
        return None

    @property
    def name(self) -> str:
        return self.spec.name

    def winner(self, measured: list) -> Any:
        """The campaign's result among `measured` (kfactory.v1 Measured events, non-empty, each measured in
        full): the lowest score (lowest_score). A problem kind may weigh more than the score (an engine: whether
        it spins)."""
        return lowest_score(measured)

    @property
    def params(self) -> dict[str, float | int]:
        """The problem's scalar parameters, name -> the spec's value (kfactory.problems.params: the reference
        gets them as keyword arguments, the kernel as scalar arguments where an ABI lists them, templates as
        variables)."""
        return {name: p.value for name, p in self.spec.params.items()}

    @cached_property
    def reference(self) -> ModuleType:
        """reference.py: `reference(inputs, **params) -> outputs` in float64, `baselines(**params)` ->
        {name: fn(inputs, outputs, threads)} and `cuda_baselines(**params)`."""
        path = self.directory / "reference.py"
        if not path.exists():
            raise ProblemError(f"{self.directory}: missing reference.py")
        mod = import_file(f"kfactory_problem_{self.name}", path)
        if not callable(getattr(mod, "reference", None)):
            raise ProblemError(f"{path}: must define reference(inputs: dict) -> dict")
        return mod

    def shapes(self, which: str = "all") -> list[dict[str, int]]:
        s = self.spec.shapes
        return {"optimize": s.optimize, "verify": s.verify, "all": s.optimize + s.verify}[which]

    def shape_str(self, shape: dict[str, int]) -> str:
        return shape_str(shape, self.spec.symbols)

    def parse_shape(self, text: str) -> dict[str, int]:
        vals = [int(v) for v in text.split("x")]
        return dict(zip(self.spec.symbols, vals))

    def tensor_shape(self, tensor, shape: dict[str, int]) -> tuple[int, ...]:
        return tuple(shape[d] if isinstance(d, str) else d for d in tensor.shape)

    def cost(self, shape: dict[str, int]) -> tuple[float, float]:
        """(bytes, flops) at a shape."""
        return (float(safe_eval(self.spec.cost.bytes, shape)), float(safe_eval(self.spec.cost.flops, shape)))

    def families_for(self, target: str) -> list[Family]:
        return [f for f in self.families.values() if f.spec.target == target]

    def reference_source(self, target: str) -> tuple[str, str]:
        """(source, flags) of the problem's reference kernel on a target."""
        ref = self.spec.reference_kernel.get(target)
        if ref is None:
            raise ProblemError(f"problem {self.name} has no reference kernel for target {target}")
        return _read_source(self.directory / ref.source, f"reference_kernel.{target}.source"), ref.flags

    def reference_kernel(self, target: str) -> tuple[str, str, str, dict | None]:
        """(source, flags, language, launch rule or None) of the reference kernel, as a candidate takes them."""
        source, flags = self.reference_source(target)
        ref = self.spec.reference_kernel[target]
        return source, flags, language_of(ref.source, target), {**ref.launch, "params": {}} if ref.launch else None

    def reference_f64(self, target: str) -> tuple[str, str, dict[str, str]] | None:
        """(source, flags, launch) of the problem's float64 reference kernel on a target (spec `reference_f64`;
        entry `reference_f64`), or None where the package has none (the judge's host reference serves)."""
        ref = self.spec.reference_f64.get(target)
        if ref is None:
            return None
        return _read_source(self.directory / ref.source, f"reference_f64.{target}.source"), ref.flags, \
            dict(ref.launch)

    def describe(self) -> str:
        """Human-readable summary: shapes, distributions, tolerances, the ABI per target, families."""
        s = self.spec
        lines = [f"{s.name}: {s.description.strip()}", "",
                 "inputs:  " + ", ".join(f"{t.name} {t.dtype}[{', '.join(map(str, t.shape))}]" for t in s.inputs),
                 "outputs: " + ", ".join(f"{t.name} {t.dtype}[{', '.join(map(str, t.shape))}]" for t in s.outputs),
                 "optimise shapes: " + ", ".join(self.shape_str(x) for x in s.shapes.optimize),
                 "verify shapes:   " + ", ".join(self.shape_str(x) for x in s.shapes.verify),
                 "distributions:   " + ", ".join(s.distributions),
                 "tolerance:       " + "; ".join(f"{k}: atol={v.atol} rtol={v.rtol} norm_rel={v.norm_rel}"
                                                 for k, v in s.tolerance.items()),
                 "baselines:       " + (", ".join(s.baselines) or "none")]
        if s.params:
            lines.append("params:          " + "; ".join(_param_line(n, p) for n, p in s.params.items()))
        lines.append("")
        for target, abi in s.abi.items():
            lines += [f"ABI ({target}): {abi.signature}", f"  arguments: {', '.join(abi.args)}"]
            if abi.notes:
                lines.append("  " + " ".join(abi.notes.split()))
        for f in self.families.values():
            lines.append(f"family {f.name} ({f.spec.target}, {f.spec.language}): {len(f.points())} valid points; "
                         + ", ".join(f"{k}={v}" for k, v in f.spec.params.items()))
        return "\n".join(lines)


def _param_line(name: str, p) -> str:
    rng = f" in [{'-inf' if p.min is None else p.min}, {'inf' if p.max is None else p.max}]" \
        if p.min is not None or p.max is not None else ""
    return f"{name} = {p.value} ({p.type}{rng})" + (f": {' '.join(p.doc.split())}" if p.doc else "")
