"""Engines on Llama shapes the other tests do not take: every design path verified against the float64 reference
on random-weights models of other head groupings and head sizes (a model a user brings is not SmolLM2).

The shapes: 4 query heads a key/value head (no `attend_group`: one head a work item), plain multi-head attention
(a group of 1), multi-query attention (6 heads on one key/value head), heads of 128, and SmolLM2-360M's grouping
(15 query heads on 5 key/value heads, 3 blocks). Each is a tiny-llama package with its architecture changed
(kfactory.models.tiny writes its weights); each design is built and verified as a campaign verifies it, with its
prompts of 1, 7, 100 and 244 tokens (contexts past 64: the split decode attention on 2 and 3 threads).
"""
from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor

import pytest
import yaml

from kfactory.engines.build import build
from kfactory.engines.codegen import generate
from kfactory.engines.design import Q4_DECODES, EngineDesign, q4_decodes_offered
from kfactory.engines.verify import Verifier
from kfactory.models import load_model

SHAPES = {
    "group4": {"hidden": 128, "heads": 8, "kv_heads": 2, "head_dim": 16, "ffn": 256},
    "mha": {"hidden": 128, "heads": 4, "kv_heads": 4, "head_dim": 32, "ffn": 224},
    "mqa": {"hidden": 96, "heads": 6, "kv_heads": 1, "head_dim": 16, "ffn": 160},
    "head128": {"hidden": 256, "heads": 2, "kv_heads": 1, "head_dim": 128, "ffn": 352},
    "kv5": {"hidden": 480, "heads": 15, "kv_heads": 5, "head_dim": 32, "ffn": 960, "blocks": 3},
}

_VNNI24 = "vnni24" in q4_decodes_offered()
#: one thread with the defaults; the step in one region on 3 threads (vnni24 where the host has VNNI); the op
#: path on 2 threads with unfused products and the token-major cache; f32 weights with the tiled prefill
DESIGNS = [
    EngineDesign(),
    EngineDesign(threads=3, wait="bounded", team="step", q4_decode="vnni24" if _VNNI24 else Q4_DECODES[0]),
    EngineDesign(threads=2, team="op", fuse_qkv=False, fuse_gate_up=False, kv_layout="token_major"),
    EngineDesign(weights="f32", threads=2, team="step", prefill="tiled"),
]


@pytest.fixture(scope="module")
def verifiers(tmp_path_factory):
    """A Verifier for each shape, its package written beside its weights and reference answers."""
    root = tmp_path_factory.mktemp("shapes")
    base = yaml.safe_load((load_model("tiny-llama").directory / "model.yaml").read_text())
    out = {}
    for name, arch in SHAPES.items():
        spec = {**base, "name": f"tiny-{name}", "architecture": {**base["architecture"], **arch}}
        pkg = root / name / "pkg"
        pkg.mkdir(parents=True)
        (pkg / "model.yaml").write_text(yaml.safe_dump(spec))
        out[name] = Verifier(str(pkg), cache_dir=root / name / "cache", reference_dir=root / name / "ref")
    return out


@pytest.mark.parametrize("shape", list(SHAPES))
def test_every_design_passes_verification_on_the_shape(verifiers, shape, tmp_path):
    verifier = verifiers[shape]
    config = verifier.model.config
    assert (config.heads, config.kv_heads, config.head_dim) == tuple(SHAPES[shape][k]
                                                                     for k in ("heads", "kv_heads", "head_dim"))
    with ThreadPoolExecutor(2) as pool:
        libs = list(pool.map(lambda d: build(generate(d, config), tmp_path), DESIGNS))
    for design, lib in zip(DESIGNS, libs):
        assert lib.ok and lib.path is not None, f"{design.design_id()} did not build:\n{lib.log}"
        verdict = verifier.verify(design, lib.path)
        assert verdict.passed, verdict.summary()
        # the worst step of every check well inside the tolerance (fp32 rounding measures 2.7e-6..5.7e-6 here)
        assert max(c.max_err for c in verdict.checks) < verifier.tolerance / 5, verdict.summary()
        # the split decode attention ran: the plan's longest prompt reaches past KF_SPLIT_MIN (64) positions
        assert max(verifier.plan.prompt_lengths) > 64
