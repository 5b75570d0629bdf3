"""Every adversarial kernel of tests/adversarial/ mixed into one campaign, with the honest ones: the campaign
finishes, records a verdict for each with the expected typed reason, and no service stops."""
from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from kfactory.v1 import events_pb2 as pb
from test_campaign import _campaign

# the speed-of-light floor and the runner's timeouts judge these kernels: `make test` runs them alone
pytestmark = pytest.mark.serial

HERE = Path(__file__).parent / "adversarial"


async def test_a_campaign_with_every_cheat_mixed_in(memory_bus_settings, small_softmax):
    manifest = yaml.safe_load((HERE / "manifest.yaml").read_text())
    spec = pb.CampaignSpec(problem=small_softmax, target="cpu", budget_candidates=1, strategy="random", seed=5,
                           parallel=2)
    expected = {}
    for k in manifest["kernels"]:
        name = Path(k["file"]).stem
        expected[name] = {k["expected_reason"], *k.get("also_accept", [])}
        spec.manual_sources.append(pb.ManualSource(name=name, source=(HERE / k["file"]).read_text(),
                                                   compile_flags=manifest["flags"], threads=2))
    for path in sorted((HERE / "honest").glob("*.c")):
        expected[f"honest_{path.stem}"] = {"measured"}
        spec.manual_sources.append(pb.ManualSource(name=f"honest_{path.stem}", source=path.read_text(),
                                                   compile_flags=manifest["flags"], threads=2))
    st, running = await _campaign(memory_bus_settings, spec, timeout=600)
    assert st.finished.state == "completed"
    assert running.failed() is None
    rows = running.services["memory"].archive.q(
        "SELECT c.origin, o.reason FROM outcomes o JOIN candidates c ON c.campaign=o.campaign AND c.id=o.candidate "
        "WHERE o.campaign=?", (st.id,))
    got = {origin.removeprefix("manual:"): reason for origin, reason in rows if origin.startswith("manual:")}
    assert set(got) == set(expected), set(expected) ^ set(got)
    wrong = {name: (got[name], sorted(want)) for name, want in expected.items() if got[name] not in want}
    assert not wrong, wrong
