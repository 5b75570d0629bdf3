"""Strategy options (issue 25, deliverable 5): each strategy declares its options in a table, an option set with
`--strategy-option` reaches the strategy the planner makes, a wrong one fails at submit (one line, exit 2), and
`kfactory strategies describe NAME` prints the table."""
from __future__ import annotations

import asyncio
import inspect
import os
import shutil
import subprocess
import sys

import pytest

from kfactory.cli.main import _spec, build_parser
from kfactory.platform.app import start_services
from kfactory.problems import load_problem
from kfactory.services.planner.campaign import CampaignState
from kfactory.services.planner.specs import SpecError, validate
from kfactory.strategies import KNOWN, BadStrategyOption, check_options, make_strategy, options_table
from kfactory.strategies.base import Space
from kfactory.targets import get_target
from kfactory.v1 import events_pb2 as pb

KFACTORY = [sys.executable, "-m", "kfactory.cli.main"]


def _planned(*flags: str):
    """The strategy the planner makes for `kfactory run softmax FLAGS...`: the spec as the command line builds it,
    through the planner's own campaign state."""
    spec = _spec(build_parser().parse_args(["run", "softmax", "--seed", "3", *flags]))
    space = Space(list(load_problem("softmax").families.values()))
    state = CampaignState("c1", spec, pb.DeviceInfo(), space)
    assert state.strategy is not None, state.strategy_error
    return state.strategy


def test_an_option_set_on_the_command_line_reaches_the_strategy():
    s = _planned("--strategy", "evolutionary", "--strategy-option", "islands=3", "--strategy-option",
                 "fail_reject=0.5")
    assert (s.n_islands, s.fail_reject) == (3, 0.5)


def test_a_portfolio_members_option_reaches_that_member():
    s = _planned("--strategy-option", "members=tpe,evolutionary", "--strategy-option", "evolutionary.elite=4")
    assert s.names == ["tpe", "evolutionary"]
    assert s.members[1].elite == 4 and s.members[0].keep == options_table("tpe")["keep"].default


@pytest.mark.parametrize("flag, says", [
    ("bogus=1", "kfactory run: strategy_options: strategy default has no option 'bogus'; its options: members, "),
    ("decay=2", "kfactory run: strategy_options: strategy default: option decay=2 is above 1"),
    ("cma.design=3", "'cma' is not one of its members (surrogate, tpe, evolutionary)"),
    ("islands", "kfactory: --strategy-option 'islands': expected NAME=VALUE"),
])
def test_a_wrong_option_is_one_line_and_exit_2_before_anything_starts(tmp_path, host_ceilings, flag, says):
    data = tmp_path / "data"
    data.mkdir()
    shutil.copy(host_ceilings, data / "ceilings.json")
    env = {**os.environ, "KFACTORY_DATA_DIR": str(data), "KFACTORY_REPORT_DIR": str(tmp_path / "reports")}
    out = subprocess.run([*KFACTORY, "run", "softmax", "--quiet", "--strategy-option", flag], capture_output=True,
                         text=True, env=env, cwd=tmp_path, timeout=60)
    assert out.returncode == 2, out
    assert out.stderr.count("\n") == 1 and says in out.stderr and "Traceback" not in out.stderr, out.stderr
    assert not list(tmp_path.glob("**/archive.sqlite")), "a service started"


def test_the_planner_refuses_an_unknown_option_at_submit(settings):
    """The check `submit` runs (the planner's spec validation), on a spec that did not come from the CLI."""
    spec = pb.CampaignSpec(problem="softmax", target="cpu", strategy="tpe", budget_candidates=4,
                           strategy_options={"startup": "5", "populaton": "9"})
    with pytest.raises(SpecError, match=r"^strategy_options: strategy tpe has no option 'populaton'; its options: "):
        validate(spec, settings, load_problem, lambda t: get_target(t, settings))


async def test_kfactory_submit_of_an_unknown_option_is_one_line_and_exit_2(memory_bus_settings):
    """`kfactory submit` to a running planner: its Submit refuses the spec, and the client says so in one line."""
    running = await start_services(memory_bus_settings, names=("planner",))
    try:
        async with asyncio.timeout(20):
            while not running.services["planner"].grpc_port:
                await asyncio.sleep(0.05)
        planner = f"127.0.0.1:{running.services['planner'].grpc_port}"
        proc = await asyncio.create_subprocess_exec(
            *KFACTORY, "submit", "softmax", "--strategy", "tpe", "--strategy-option", "startup=5",
            "--strategy-option", "populaton=9", "--planner", planner,
            stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE)  # beside the planner's event loop
        out, err = await asyncio.wait_for(proc.communicate(), 60)
    finally:
        await running.shutdown()
    text = err.decode()
    assert proc.returncode == 2 and not out, (proc.returncode, out, text)
    assert text.count("\n") == 1 and "strategy_options: strategy tpe has no option 'populaton'; its options: " \
        "sampler, startup, " in text and "Traceback" not in text, text


def test_strategies_describe_prints_the_table():
    out = subprocess.run([*KFACTORY, "strategies", "describe", "surrogate"], capture_output=True, text=True,
                         timeout=60)
    assert out.returncode == 0, out
    lines = out.stdout.splitlines()
    assert lines[0].startswith("surrogate: Model-based search")
    header = next(i for i, line in enumerate(lines) if line.split()[:3] == ["option", "type", "default"])
    rows = {line.split()[0]: line.split() for line in lines[header + 1:] if line.strip() and "set with" not in line}
    assert set(rows) == set(options_table("surrogate"))
    assert rows["init"][1:3] == ["int", "10"] and rows["local"][3] == "[0,1]"


def test_strategies_list_names_every_strategy_and_describe_refuses_an_unknown_one():
    listed = subprocess.run([*KFACTORY, "strategies", "list"], capture_output=True, text=True, timeout=60)
    assert [line.split()[0] for line in listed.stdout.splitlines()] == list(KNOWN)
    wrong = subprocess.run([*KFACTORY, "strategies", "describe", "annealing"], capture_output=True, text=True,
                           timeout=60)
    assert wrong.returncode == 2 and wrong.stderr.startswith("kfactory: unknown strategy 'annealing'; known: ")


@pytest.mark.parametrize("name", KNOWN)
def test_each_tables_defaults_are_its_strategys_own(name):
    """A table that drifted from the constructor would document defaults the strategy does not use."""
    strategy = make_strategy(name, Space(list(load_problem("softmax").families.values())), seed=1)
    params: dict[str, inspect.Parameter] = {}
    for klass in reversed(type(strategy).__mro__[:-1]):  # a subclass's default wins over its base's
        params.update(inspect.signature(klass.__init__).parameters)
    for option, row in options_table(name).items():
        if option in params and params[option].default is not inspect.Parameter.empty:
            assert params[option].default == row.default, (name, option)


def test_typed_options_from_python_are_checked_too():
    assert check_options("grid", {"shuffle": True}) == {"shuffle": True}
    with pytest.raises(BadStrategyOption, match="option shuffle=1 is not a boolean"):
        check_options("grid", {"shuffle": 1})
    with pytest.raises(BadStrategyOption, match="strategy random has no option 'seed'; its options: none"):
        check_options("random", {"seed": 1})
