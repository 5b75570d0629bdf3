"""`kfactory priors`'s account of a warm start (kfactory/evidence/warm_sources.py, kfactory/cli/client.py) says
what a new campaign would do: the sources it learns from (a source with fewer than transfer.MIN_POINTS distinct
points is not learned from), the families of the campaign's target, and the campaigns that judged the sources
before, found under the names imported evidence brought."""
from __future__ import annotations

import argparse
import json

import pytest

from kfactory.cli.client import ClientError, _priors_families
from kfactory.evidence import warm_sources
from kfactory.strategies import Space
from kfactory.strategies.base import Evidence
from kfactory.strategies.transfer import MIN_POINTS, PriorMean
from kfactory.strategies.encoding import index_of
from kfactory.strategies.surrogate import GP
from kfactory.problems import load_problem
from kfactory.v1 import events_pb2 as pb
from kfactory.v1 import services_pb2 as spb


def _prior(campaign: str, params: str, score: float) -> pb.Prior:
    return pb.Prior(family="cpu_c", params_json=params, score_s=score, relative=1.0, device="cpu-x",
                    campaign_id=campaign)


def test_a_source_too_small_to_learn_from_has_no_start_weight():
    """The campaign fits no landscape to fewer than MIN_POINTS distinct points and never proposes theirs; a point
    a source reported twice counts once, as the campaign counts it."""
    priors = [_prior("big", f'{{"i":{i}}}', 1e-3 * (1 + i)) for i in range(5)]
    priors += [_prior("small", '{"i":0}', 1e-4), _prior("small", '{"i":1}', 2e-4), _prior("small", '{"i":1}', 2e-4)]
    sources = warm_sources.sources_of(priors)
    assert [(s["source"], s["points"]) for s in sources] == [("big", 5), ("small", 2)]
    view = warm_sources.priors_view(sources, None)
    assert {s["source"]: s["start_weight"] for s in view["sources"]} == {"big": 1.0, "small": 0.0}
    text = warm_sources.priors_text(view)
    assert "would learn from 1 source(s)" in text and f"fewer than {MIN_POINTS} points" in text
    assert "at least 5 results" in text and "keep at least half" not in text
    # no campaign has judged them: said so, not as though their own campaigns had measured nothing
    text = warm_sources.priors_text(warm_sources.priors_view(sources, []))
    assert text.endswith("\nno finished campaign has started warm from them yet, so none has judged how well they "
                         "predict."), text
    view = warm_sources.priors_view(warm_sources.sources_of(priors[5:]), None)
    text = warm_sources.priors_text(view)
    assert text.startswith("no source with enough points to learn a landscape from (small: 2 point(s))"), text
    assert "propose their best points first" in text


def test_a_source_repeating_one_point_is_not_learned_from():
    space = Space(load_problem("softmax").families_for("cpu"))
    points = index_of(space).points
    evidence = [Evidence(points[0], r, "echo") for r in (1.0, 2.0, 4.0)]
    evidence += [Evidence(p, 1.0 + i, "many") for i, p in enumerate(points[:MIN_POINTS])]
    assert PriorMean(index_of(space), evidence, GP).sources == ["many"]


def test_the_target_picks_the_families_a_campaign_there_would_learn_of():
    ns = lambda **kw: argparse.Namespace(**{"problem": "softmax", "family": [], "target": "", **kw})  # noqa: E731
    assert _priors_families(ns()) == []  # every family, as before
    assert _priors_families(ns(target="cpu")) == ["cpu_c"]
    assert _priors_families(ns(target="cuda:sm_90a")) == ["cuda_cu", "cuda_ptx"]
    assert _priors_families(ns(target="cuda", family=["cuda_ptx", "cpu_c"])) == ["cuda_ptx"]
    with pytest.raises(ClientError) as e:
        _priors_families(ns(problem="kda_bf16", target="cpu"))
    assert e.value.code == 1 and "no family for target cpu" in str(e.value)
    with pytest.raises(ClientError) as e:
        _priors_families(ns(target="gpu"))
    assert e.value.code == 2 and "choose one of cpu, cuda" in str(e.value)
    with pytest.raises(ClientError) as e:
        _priors_families(ns(problem="/no/such/package", target="cpu"))
    assert e.value.code == 2 and "--target needs the problem here" in str(e.value)


def test_earlier_campaigns_are_found_under_the_name_imported_evidence_brought():
    """A campaign that ran from a package path of another machine is found by the resolver memory gives (its
    Archive.problem_name knows the name the evidence brought), not only by loading the path here."""
    summary = {"warm_start": {"measured": True, "results_judged": 12, "evidence_say": 0.4,
                              "sources": [{"source": "big", "agreement": 0.5, "weight": 0.4}]}}
    status = spb.CampaignStatus(id="c2", spec=pb.CampaignSpec(problem="/tmp/gone-machine/softmax"),
                                summary_json=json.dumps(summary))
    sources = [{"source": "big"}]
    assert warm_sources.history_of([status], "softmax", sources) == []
    aliases = {"/tmp/gone-machine/softmax": "softmax"}
    [seen] = warm_sources.history_of([status], "softmax", sources, lambda loc: aliases.get(loc, loc))
    assert seen["campaign"] == "c2" and seen["sources"][0]["weight"] == 0.4


def test_kfactory_priors_asks_memory_for_the_targets_families(tmp_path, monkeypatch, capsys):
    """The command end to end on a workspace whose one campaign measured cpu_c points: with --target cpu they are
    a new campaign's evidence, with --target cuda there is none (the cuda families were never measured)."""
    from kfactory.cli.main import main
    from test_progress_report import local_workspace

    local_workspace(tmp_path, monkeypatch)
    assert main(["priors", "softmax", "--target", "cpu", "--json"]) == 0
    got = json.loads(capsys.readouterr().out)
    assert got["priors"] and {p["family"] for p in got["priors"]} == {"cpu_c"}
    assert [s["points"] for s in got["trust"]["sources"]] and got["trust"]["measured_before"] == []
    assert main(["priors", "softmax", "--target", "cuda", "--json"]) == 0
    got = json.loads(capsys.readouterr().out)
    assert got.get("priors", []) == [] and got["trust"]["sources"] == []
    with pytest.raises(SystemExit) as usage:   # argparse's: the flag named, exit 2
        main(["priors", "softmax", "--target", "gpu"])
    assert usage.value.code == 2 and "argument --target: unknown target 'gpu'" in capsys.readouterr().err
