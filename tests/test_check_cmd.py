"""`kfactory check`: one kernel judged as a candidate; exit codes 0 passed, 1 rejected, 2 usage."""
from __future__ import annotations

import json
import shutil

import pytest

from conftest import KERNELS
from kfactory.cli.main import main
from kfactory.problems import load_problem

# the speed-of-light floor and the runner's timeouts judge these kernels: `make test` runs them alone
pytestmark = pytest.mark.serial


@pytest.fixture(autouse=True)
def fast(monkeypatch, tmp_path, host_ceilings):
    """Short timings, and the host's ceilings measured once for the session (measuring them costs 12 s)."""
    (tmp_path / "data").mkdir()
    shutil.copy(host_ceilings, tmp_path / "data" / "ceilings.json")
    for k, v in {"KFACTORY_DATA_DIR": str(tmp_path / "data"), "KFACTORY_MEASURE_MAX_S": "0.2",
                 "KFACTORY_MEASURE_MIN_S": "0.05", "KFACTORY_COMPARE_MAX_S": "0.3",
                 "KFACTORY_RUNNER_TIMEOUT_S": "4", "KFACTORY_THREADS": "2"}.items():
        monkeypatch.setenv(k, v)


def test_an_honest_kernel_passes_and_is_measured(small_softmax, tmp_path, capsys):
    src = tmp_path / "my ref.c"
    src.write_text(load_problem(small_softmax).reference_source("cpu")[0])
    out = tmp_path / "v.json"
    assert main(["check", small_softmax, "--source", str(src), "--flags", "-O3 -fopenmp", "--json", str(out)]) == 0
    # its id names nothing `best` or `export` finds (check archives nothing): it says how to keep the kernel
    keep = capsys.readouterr().err.splitlines()[-1]
    assert keep == (f"(check archives nothing; to keep it for best and export: kfactory run {small_softmax} --manual "
                    f"'my_ref={src}:-O3 -fopenmp' --budget 1)"), keep
    v = json.loads(out.read_text())
    assert v["compiled"] and v["verdict"]["passed"] and v["verdict"]["reason"] is None
    assert len(v["verdict"]["checks"]) == 8 * 5 + 3  # shapes x distributions, then the memoisation probe
    assert v["speedup_vs_reference"] > 0 and "numpy" in v["measurement"]["speedups"]["64x1000"]


@pytest.mark.parametrize("name,reason", [("wrong", "WRONG_RESULT"), ("segfault", "CRASHED")])
def test_a_broken_kernel_is_rejected_with_its_reason(small_softmax, tmp_path, name, reason):
    out = tmp_path / "v.json"
    assert main(["check", small_softmax, "--source", str(KERNELS / f"{name}.c"), "--json", str(out)]) == 1
    v = json.loads(out.read_text())
    assert v["verdict"]["reason"] == reason and v["measurement"] is None


def test_a_kernel_that_does_not_compile_shows_the_compilers_words_about_its_file(small_softmax, tmp_path,
                                                                                  capsys):
    src = tmp_path / "mine.c"
    src.write_text("#include <stdint.h>\nvoid kernel(const float *x, float *y, int64_t rows, int64_t cols) {\n"
                   "  y[0] = x[0] +;\n}\n")
    assert main(["check", small_softmax, "--source", str(src)]) == 1
    err = capsys.readouterr().err
    assert f"{src}:3:" in err and "error" in err and "kf-cc-" not in err, err
    assert err.rstrip().splitlines()[-1].endswith("rejected: COMPILE_ERROR: cc exited with 1"), err


def test_static_check_and_compile_only(small_softmax, tmp_path):
    bad = tmp_path / "bad.c"
    bad.write_text("#include <stdio.h>\nvoid kernel(void){}\n")
    out = tmp_path / "v.json"
    assert main(["check", small_softmax, "--source", str(bad), "--json", str(out)]) == 1
    assert json.loads(out.read_text())["verdict"]["reason"] == "STATIC_CHECK"
    assert main(["check", small_softmax, "--source", str(KERNELS / "wrong.c"), "--compile-only"]) == 0


def test_usage_errors_exit_2(small_softmax, tmp_path):
    assert main(["check", small_softmax, "--source", str(tmp_path / "missing.c")]) == 2
    assert main(["check", "no_such_problem", "--source", str(KERNELS / "wrong.c")]) == 2


def test_a_language_the_target_cannot_compile_or_cannot_tell_is_a_usage_error(small_softmax, tmp_path, capsys):
    """--language cuda on the cpu target was a kernel rejected with COMPILE_ERROR (exit 1); a file named .txt was
    compiled as C, and one named .cxx too (its C++ read as C)."""
    text = tmp_path / "kernel.txt"
    shutil.copy(KERNELS / "wrong.c", text)
    assert main(["check", small_softmax, "--source", str(text)]) == 2
    assert capsys.readouterr().err.strip() == (f"kfactory check: cannot tell the language of --source {text} from "
                                               "its suffix (known: .c, .cc, .cpp, .cxx, .c++, .cu, .ptx): give "
                                               "--language")
    assert not (tmp_path / "data" / "so").exists(), "the kernel was compiled"
    assert main(["check", small_softmax, "--source", str(KERNELS / "wrong.c"), "--language", "cuda"]) == 2
    assert capsys.readouterr().err.strip() == ("kfactory check: the cpu target compiles c or cpp, not 'cuda': give "
                                               "--language or --target to match the source")
    assert main(["check", small_softmax, "--source", str(text), "--language", "c", "--compile-only"]) == 0
    cxx = tmp_path / "kernel.cxx"
    cxx.write_text('extern "C" void kernel(const float *x, float *y, long rows, long cols) {}\n')
    assert main(["check", small_softmax, "--source", str(cxx), "--compile-only"]) == 0


def test_a_source_not_utf8_and_an_unwritable_json_are_usage_errors_before_the_judging(small_softmax, tmp_path,
                                                                                     capsys):
    """A Latin-1 comment was an internal error (exit 70, a bug report); a --json in no directory was found only
    after the kernel had been judged, and the verdict lost."""
    latin = tmp_path / "latin.c"
    latin.write_bytes((KERNELS / "wrong.c").read_bytes() + "/* café */\n".encode("latin-1"))
    assert main(["check", small_softmax, "--source", str(latin)]) == 2
    err = capsys.readouterr().err
    assert f"cannot read --source {latin}: not UTF-8 text (byte " in err and "internal error" not in err, err
    assert main(["check", small_softmax, "--source", str(KERNELS / "wrong.c"), "--json",
                 str(tmp_path / "no" / "v.json")]) == 2
    err = capsys.readouterr().err
    assert err.strip() == f"kfactory check: --json {tmp_path}/no/v.json: the directory {tmp_path}/no does not exist"
    assert not (tmp_path / "data" / "so").exists(), "the kernel was compiled"


def test_a_source_over_the_campaigns_limit_is_refused_as_a_campaign_refuses_it(small_softmax, tmp_path, capsys,
                                                                            monkeypatch):
    """`check` judges one kernel as a campaign judges a candidate: a campaign's coder and spec refuse a source over
    KFACTORY_MAX_SOURCE_BYTES, which check compiled and passed."""
    monkeypatch.setenv("KFACTORY_MAX_SOURCE_BYTES", "2048")
    big = tmp_path / "big.c"
    big.write_text((KERNELS / "wrong.c").read_text() + "/* padding */\n" * 200)
    assert main(["check", small_softmax, "--source", str(big)]) == 2
    size = len(big.read_bytes())
    assert capsys.readouterr().err.strip() == (f"kfactory check: --source {big}: {size} bytes, over the 2048-byte "
                                               "limit (KFACTORY_MAX_SOURCE_BYTES)")
    assert not (tmp_path / "data" / "so").exists(), "the kernel was compiled"
