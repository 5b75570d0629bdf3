"""What a user's own reference.py can get wrong, caught before a campaign (`kfactory problems check`, the checks
`kfactory run` runs first) and, where it can only show later, by the verifier: a reference that ends the program,
returns a list or integers for a float output, writes into its inputs (the judge hands those same inputs to the
kernels: they are read-only while it runs), answers differently twice, or transposes its answer (right at 1x1)."""
from __future__ import annotations

import shutil
import subprocess
import sys
import textwrap

import pytest
import yaml

from kfactory.problems import BUILTIN_DIR, ProblemError, load_problem
from kfactory.problems.check import problems_of

SOFTMAX = ('x = inputs["x"].astype(np.float64)\n'
           "e = np.exp(x - x.max(axis=-1, keepdims=True))\n"
           "y = e / e.sum(axis=-1, keepdims=True)\n")


def _package(tmp_path, body: str, top: str = "") -> str:
    """The built-in softmax package under a name of its own, its reference() replaced by `body` (which may use
    SOFTMAX's y) and `top` added at module level."""
    dst = tmp_path / "mine"
    shutil.copytree(BUILTIN_DIR / "softmax", dst)
    spec = yaml.safe_load((dst / "problem.yaml").read_text())
    spec["name"] = "mine"
    (dst / "problem.yaml").write_text(yaml.safe_dump(spec, sort_keys=False))
    ref = dst / "reference.py"
    code = ref.read_text().replace("def reference(inputs", "def _unused(inputs", 1)
    ref.write_text(code + f"\n{top}\n\ndef reference(inputs):\n" + textwrap.indent(body, "    "))
    return str(dst)


@pytest.mark.parametrize("body, says", [
    ("import sys\nsys.exit(0)\n", "reference() called sys.exit(0)"),
    (SOFTMAX + "return {'y': y.tolist()}\n", "output 'y' is a list, not a numpy array of numbers"),
    (SOFTMAX + "return {'y': (y * 100).astype(np.int64)}\n", "output 'y' is int64, for a float32 output"),
    (SOFTMAX + "inputs['x'][...] = 0\nreturn {'y': y}\n", "its inputs are read-only while it runs"),
    ("x = inputs['x']\nx -= x.max()\n" + SOFTMAX + "return {'y': y}\n", "its inputs are read-only while it runs"),
    ("inputs['x'] = inputs['x'] * 2\n" + SOFTMAX + "return {'y': y}\n", "reference() wrote into its inputs"),
    (SOFTMAX + "return {'y': y * np.random.uniform(0.5, 1.5)}\n", "gave two answers for the same inputs"),
    (SOFTMAX + "return {'y': np.ascontiguousarray(y.T).reshape(y.shape) if y.shape[0] == y.shape[1] else y.T}\n",
     "output 'y' has shape"),
], ids=["sys.exit", "list", "integers", "writes x", "in place", "replaces x", "random", "transposed"])
def test_a_reference_that_cannot_be_the_truth_is_named(tmp_path, body, says):
    found = problems_of(load_problem(_package(tmp_path, body)))
    assert len(found) == 1 and says in found[0] and "reference.py" in found[0], found


def test_a_reference_that_ends_the_program_on_import_is_a_problem_error(tmp_path):
    problem = load_problem(_package(tmp_path, SOFTMAX + "return {'y': y}\n", top="import sys\nsys.exit(3)"))
    with pytest.raises(ProblemError, match=r"importing it called sys.exit\(3\)"):
        problem.reference


def test_problems_check_says_so_and_exits_1_where_it_exited_0_silently(tmp_path):
    pkg = _package(tmp_path, "import sys\nsys.exit(0)\n")
    out = subprocess.run([sys.executable, "-m", "kfactory.cli.main", "problems", "check", pkg], capture_output=True,
                         text=True, timeout=120)
    assert out.returncode == 1 and "called sys.exit(0)" in out.stderr and "Traceback" not in out.stderr, out


def test_the_built_in_references_pass(tmp_path):
    for name in ("softmax", "rmsnorm", "rope"):
        assert problems_of(load_problem(name)) == [], name


def test_a_reference_kernel_file_that_is_missing_is_named(tmp_path):
    pkg = _package(tmp_path, SOFTMAX + "return {'y': y}\n")
    spec = yaml.safe_load(open(f"{pkg}/problem.yaml"))
    (tmp_path / "mine" / spec["reference_kernel"]["cpu"]["source"]).unlink()
    found = problems_of(load_problem(pkg))
    assert len(found) == 1 and "problem.yaml: reference_kernel.cpu.source: cannot read" in found[0], found


def test_the_inputs_are_writable_again_after_the_reference(tmp_path):
    """Read-only only while the reference runs: the judge copies and poisons around them afterwards."""
    from kfactory.judge import inputs as inp
    from kfactory.problems.check import run_reference

    problem = load_problem("softmax")
    shape = {"rows": 3, "cols": 17}
    x = inp.draw(problem, shape, "normal", seed=1)
    run_reference(problem, x, shape, "normal")
    assert all(a.flags.writeable for a in x.values())
