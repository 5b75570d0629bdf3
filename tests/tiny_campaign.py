"""A real campaign of a tiny problem package, for tests that need a workspace holding one: the built-in softmax
copied under a temporary directory (at tiny optimisation shapes, with the built-in's verification shapes and a
smaller one), run through every service on embedded NATS (budget 2, random strategy: seconds)."""
from __future__ import annotations

import asyncio
import shutil
from pathlib import Path
from typing import cast

import yaml

from kfactory.bus.natsd import EmbeddedNats
from kfactory.cli.run import _memory_ready
from kfactory.platform.app import start_services
from kfactory.platform.config import Settings
from kfactory.problems import BUILTIN_DIR
from kfactory.services.memory.service import MemoryService
from kfactory.services.planner.service import PlannerService
from kfactory.v1 import events_pb2 as pb


def tiny_package(path: Path, name: str | None = None) -> Path:
    """The built-in softmax package copied to `path` (under the problem name `name`, when given), timed at tiny
    shapes and verified at the built-in's shapes and a smaller one."""
    shutil.copytree(BUILTIN_DIR / "softmax", path)
    spec = yaml.safe_load((path / "problem.yaml").read_text())
    if name is not None:
        spec["name"] = name
    spec["shapes"] = {"optimize": [{"rows": 16, "cols": 256}],
                      "verify": [{"rows": 3, "cols": 17}, *spec["shapes"]["verify"]]}   # the built-in's and more
    (path / "problem.yaml").write_text(yaml.safe_dump(spec, sort_keys=False))
    return path


def run_campaign(root: Path, pkg: Path, host_ceilings: Path) -> dict:
    """A campaign of `pkg` in a new workspace under `root` (its data dir `root/data`, with the host's ceilings
    copied in): {"data": the data dir, "pkg": pkg, "campaign": its id}, once the archive holds it finished."""
    data = root / "data"
    data.mkdir()
    shutil.copy(host_ceilings, data / "ceilings.json")
    nats = EmbeddedNats(root / "nats")
    settings = Settings(nats_url=nats.start(), data_dir=data, report_dir=root / "reports", threads=2,
                        measure_min_s=0.02, measure_max_s=0.05, compare_max_s=0.1, screen_max_s=0.0,
                        planner_addr="127.0.0.1:0", memory_addr="127.0.0.1:0")

    async def campaign() -> str:
        running = await start_services(settings)
        try:
            await _memory_ready(running)
            cid = await cast(PlannerService, running.services["planner"]).submit(pb.CampaignSpec(
                problem=str(pkg), target="cpu", budget_candidates=2, strategy="random", seed=5, warm_start=0))
            archive = cast(MemoryService, running.services["memory"]).archive
            async with asyncio.timeout(120):
                while not archive.q("SELECT 1 FROM campaigns WHERE id=? AND finished_ns IS NOT NULL", (cid,)):
                    assert running.failed() is None, running.failed()
                    await asyncio.sleep(0.1)
            return cid
        finally:
            await running.shutdown()

    try:
        cid = asyncio.run(campaign())
    finally:
        nats.stop()
    return {"data": data, "pkg": pkg, "campaign": cid}
