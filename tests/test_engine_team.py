"""A decode step in one parallel region (design team "step", kfactory/engines/c/team.c) computes the logits of a
region an op (team "op") bit for bit: the same kernels, each thread its share of every product's rows, the
element-wise ops computed by every thread on its own copy of the residual stream, the attention's items and
merge as forward() cuts them.

Run on a widened tiny Llama (heads of 32, so a thread's share of the QKV rows ends inside a head and RoPE runs
on part of one) with every product and attention in parallel (KF_PAR_MIN lowered to 0: tiny models' products
fall below it), on 2 and 3 threads, after short contexts (one key/value head: one attention item) and after 64
positions (the context split in one part a thread, merged). Every build refuses an implicit declaration (a
function used where a configuration leaves it out), and one pair is built without AVX2 (the portable kernels)."""
from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from dataclasses import replace

import numpy as np
import pytest
import yaml

from kfactory.engines.build import build
from kfactory.engines.codegen import generate
from kfactory.engines.design import EngineDesign, q4_decodes_offered
from kfactory.engines.ops import units_for
from kfactory.engines.runner import EngineRunner
from kfactory.models import load_model
from test_engine_ops import ID4, ID8, kernels

VNNI = "vnni" in q4_decodes_offered()

#: tiny-llama widened: 3 query heads of 32 on one key/value head (QKV 160 rows: 10 groups of 16, cut 5:5 on 2
#: threads and 3:3:4 on 3, both inside a head)
WIDE = {"name": "tiny-wide", "hidden": 96, "heads": 3, "kv_heads": 1, "head_dim": 32}

#: designs whose decode paths differ: PACK4 Q4_1 with the fused ops, GGUF rows with separate matvecs and norms,
#: the token-major cache and one op on one thread, f32 weights, the tiled prefill (whose decode attends one head
#: an item: no split context), searched matvec kernels (the whole matrix on one thread), and the integer decodes
#: over PACK16
DESIGNS = [
    EngineDesign(threads=3, wait="bounded"),
    EngineDesign(threads=3, wait="bounded", fuse_qkv=False, fuse_gate_up=False, fuse_norm=False, prepack=False,
                 kv_layout="token_major", op_threads="qkv=1,o=2"),
    EngineDesign(weights="f32", threads=2, wait="bounded"),
    EngineDesign(threads=3, wait="bounded", prefill="tiled"),
    EngineDesign(threads=2, wait="bounded", prepack=False, matvec_q4_1=ID4, matvec_q8_0=ID8),
    *([EngineDesign(q4_decode="vnni24", threads=3, wait="bounded", fuse_gate_up=False),
       EngineDesign(q4_decode="vnni", threads=2, wait="bounded")] if VNNI else []),
]
#: every build: a function a configuration leaves out must not be called (GCC 14 and clang refuse it by default)
STRICT = ("-Werror=implicit-function-declaration",)
#: the portable build (no AVX2, FMA or F16C: no attend_group, the scalar kernels) of the first design
SCALAR = ("-mno-avx2", "-mno-fma", "-mno-f16c")

PAR_MIN = ("#define KF_PAR_MIN 32768.0", "#define KF_PAR_MIN 0.0")


@pytest.fixture(scope="module")
def wide(tmp_path_factory):
    """The widened package's directory and the cache its weights are generated into."""
    root = tmp_path_factory.mktemp("wide")
    spec = yaml.safe_load((load_model("tiny-llama").directory / "model.yaml").read_text())
    spec["name"] = WIDE["name"]
    spec["architecture"].update({k: v for k, v in WIDE.items() if k != "name"})
    (root / "pkg").mkdir()
    (root / "pkg" / "model.yaml").write_text(yaml.safe_dump(spec))
    return str(root / "pkg"), root / "cache"


@pytest.fixture(scope="module")
def libs(wide, tmp_path_factory):
    """{(design_id, team): library} for every design as "op" and as "step", every product in parallel, and
    ("scalar", team) for the portable pair."""
    config = load_model(wide[0]).open(cache_dir=wide[1]).config
    out = tmp_path_factory.mktemp("so")
    jobs = {}
    for key, design, flags in [*((d.design_id(), d, STRICT) for d in DESIGNS), ("scalar", DESIGNS[0], STRICT + SCALAR)]:
        for team in ("op", "step"):
            src = generate(replace(design, team=team), config)
            assert src.count(PAR_MIN[0]) == 1
            jobs[(key, team)] = (src.replace(*PAR_MIN), flags, units_for(design, kernels()))

    def run(key):
        src, flags, units = jobs[key]
        return build(src, out, flags, units=units)

    with ThreadPoolExecutor(2) as pool:
        results = dict(zip(jobs, pool.map(run, jobs)))
    for key, res in results.items():
        assert res.ok, f"{key} did not build:\n{res.log}"
    return {key: res.path for key, res in results.items()}


def _logits(wide, design: EngineDesign, so) -> list[np.ndarray]:
    """Every logit a run gives: a 70-token prefill (every position's), 8 decode steps after it (positions past
    64: split attention), then after a reset a 3-token prompt and 8 steps (one attention item)."""
    rng = np.random.default_rng(11)
    prompt = [int(t) for t in rng.integers(3, 300, 70)]
    out = []
    with EngineRunner(wide[0], design, so, 128, cache_dir=wide[1]) as run:
        out.append(run.prefill(prompt, all_logits=True))
        out += [run.decode(int(t)) for t in rng.integers(3, 300, 8)]
        run.reset()
        out.append(run.prefill(prompt[:3]))
        out += [run.decode(int(t)) for t in rng.integers(3, 300, 8)]
    return out


@pytest.mark.parametrize("design", DESIGNS, ids=[d.design_id() for d in DESIGNS])
def test_a_step_in_one_region_gives_the_same_logits(wide, libs, design):
    op = _logits(wide, design, libs[(design.design_id(), "op")])
    step = _logits(wide, replace(design, team="step"), libs[(design.design_id(), "step")])
    assert len(op) == len(step) == 18
    assert all(np.isfinite(a).all() and a.std() > 0 for a in op)      # real logits, not zeros
    for i, (a, b) in enumerate(zip(op, step)):
        assert np.array_equal(a, b), f"output {i}: max |op - step| = {np.abs(a - b).max():.3g}"


def test_the_portable_kernels_in_one_region_give_the_same_logits(wide, libs):
    design = DESIGNS[0]
    op = _logits(wide, design, libs[("scalar", "op")])
    step = _logits(wide, replace(design, team="step"), libs[("scalar", "step")])
    assert all(np.array_equal(a, b) for a, b in zip(op, step))


def test_a_broken_merge_is_seen(wide, libs, tmp_path):
    """The comparison can fail: a step build whose merge of split attention leaves out one part differs from
    the op build after 64 positions (and only there)."""
    design = DESIGNS[0]
    config = load_model(wide[0]).open(cache_dir=wide[1]).config
    src = generate(replace(design, team="step"), config).replace(*PAR_MIN)
    old = "  for (int c = 0; c < parts; c++) if (ml[2 * c] > m) m = ml[2 * c];"
    assert src.count(old) == 1
    res = build(src.replace(old, old + "\n  parts = parts > 1 ? parts - 1 : parts;"), tmp_path)
    assert res.ok, res.log
    op = _logits(wide, design, libs[(design.design_id(), "op")])
    broken = _logits(wide, replace(design, team="step"), res.path)
    assert np.array_equal(op[0], broken[0])                          # prefill: forward(), no split
    assert not np.array_equal(op[1], broken[1])                      # the first split decode step
    assert all(np.array_equal(a, b) for a, b in zip(op[9:], broken[9:]))   # short contexts: no split


def test_a_searched_kernel_runs_once_however_late_a_thread_comes(wide, libs, tmp_path):
    """A searched kernel takes the whole matrix on thread 0 and ropes it there: a thread held up between its
    product and its RoPE (as a loaded host can hold one) changes nothing. (When every thread ran the kernel and
    roped all rows in place, such a delay roped rows twice: outputs off by up to 11.5.)"""
    design = DESIGNS[4]
    assert design.searched_kernels()
    config = load_model(wide[0]).open(cache_dir=wide[1]).config
    src = generate(replace(design, team="step"), config).replace(*PAR_MIN)
    old = "  team_matvec(w, h, e->qkv + at, xs, id, nt, op_nt, &r0, &r1);\n"
    assert src.count(old) == 1
    late = "  if (id == 1) { struct timespec ts_ = {0, 2000000}; nanosleep(&ts_, NULL); }\n"
    res = build("#include <time.h>\n" + src.replace(old, old + late), tmp_path, STRICT,
                units=units_for(design, kernels()))
    assert res.ok, res.log
    op = _logits(wide, design, libs[(design.design_id(), "op")])
    delayed = _logits(wide, replace(design, team="step"), res.path)
    assert all(np.array_equal(a, b) for a, b in zip(op, delayed))
