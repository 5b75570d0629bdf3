"""`kfactory export MODEL` (kfactory/engines/export.py) on tiny-llama: a one-design campaign verifies the default
engine, then both formats are exported through the CLI. The Python module runs under `python -I` with kfactory
kept out of reach and generates the float64 reference's greedy tokens; the C example, built by the exported
Makefile, prints them too; the manifest's hashes are the files'; the weights file holds prepare.py's bytes; an
engine without a verified record is refused (exit 1) and a bad name or format is a usage error (exit 2)."""
from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

from kfactory.cli.main import main
from kfactory.engines import export_runtime
from kfactory.engines.build import FLAGS, LINK
from kfactory.platform import scratch
from kfactory.engines.campaign import Campaign
from kfactory.engines.design import EngineDesign
from kfactory.engines.export import ABI_FUNCTIONS, chat_split, check_library, write_weights
from kfactory.engines.prepare import FORMATS, LAYOUTS, prepare
from kfactory.export import ExportError
from kfactory.export.rename import identifiers
from kfactory.models import Reference, Tokenizer

NAME = "tinyeng"
PROMPT = "What is the capital of France?"

#: run under `python -I` in a directory away from the repository: kfactory must not be importable (the finder
#: below makes sure even where an install would make it so), then the exported module generates
CHILD = r"""
import importlib.abc, importlib.util, json, sys
import numpy as np
importable = importlib.util.find_spec("kfactory") is not None

class Block(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if name == "kfactory" or name.startswith("kfactory."):
            raise ImportError("kfactory is blocked in this test")
        return None

sys.meta_path.insert(0, Block())
out_dir, prompt, n, ids_file = sys.argv[1], sys.argv[2], int(sys.argv[3]), sys.argv[4]
sys.path.insert(0, out_dir)
import tinyeng
engine = tinyeng.Engine(out_dir)
ids = engine.encode(prompt)
tokens = list(engine.greedy(ids, n))
text = "".join(engine.generate(prompt, n))
engine.reset()
first = engine.prefill(ids)
after = engine.decode_step(int(first.argmax()))
np.save(ids_file, np.stack([first, after]))
print(json.dumps({"importable": importable, "loaded": sorted(m for m in sys.modules if m.startswith("kfactory")),
                  "ids": ids, "tokens": tokens, "text": text, "position": engine.position,
                  "modules": sorted(m.split(".")[0] for m in sys.modules if m.split(".")[0] in
                                    ("numpy", "tokenizers", "ctypes", "jinja2", "torch"))}))
"""


@pytest.fixture(scope="module")
def record(root, verifier):
    return Campaign("tiny-llama", 1, data_dir=root, verifier=verifier, rounds=1).run()


def cli(root: Path, *args: str) -> int:
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("KFACTORY_DATA_DIR", str(root))
        return main(["export", "tiny-llama", *args])


@pytest.fixture(scope="module")
def exported(root, record, tmp_path_factory):
    """{format: directory} of both exports, made through the CLI."""
    out = tmp_path_factory.mktemp("exports")
    dirs = {}
    for fmt in ("c", "python"):
        dirs[fmt] = out / fmt
        assert cli(root, "--format", fmt, "--name", NAME, "--out", str(dirs[fmt])) == 0
    return dirs


def reference_tokens(verifier, ids: list[int], n: int, stop: bool) -> list[int]:
    eos = verifier.model.tokenizer.eos_id
    return Reference.from_model(verifier.model).generate(ids, n, stop=[eos] if stop else []).tokens


def test_python_module_runs_without_kfactory_and_matches_the_reference(exported, verifier, tmp_path):
    d = exported["python"]
    assert not (d / f"lib{NAME}.so").exists()          # the module builds it on first use
    proc = subprocess.run([sys.executable, "-I", "-c", CHILD, str(d), PROMPT, "24", str(tmp_path / "logits.npy")],
                          cwd=tmp_path, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr
    got = json.loads(proc.stdout)
    assert got["loaded"] == []                          # nothing of kfactory was imported
    assert set(got["modules"]) == {"numpy", "tokenizers", "ctypes"}
    assert (d / f"lib{NAME}.so").is_file()
    tok = verifier.model.tokenizer
    ids = tok.encode(tok.chat([{"role": "user", "content": PROMPT}]))   # what `kfactory generate` feeds
    assert got["ids"] == ids
    want = reference_tokens(verifier, ids, 24, stop=True)
    assert got["tokens"] == want and len(want) >= 8
    assert got["text"] == tok.decode(want, skip_special=True)
    # the logits themselves, not only their argmax: within the verification's tolerance of the reference's
    ref = Reference.from_model(verifier.model)
    cache = ref.new_cache(len(ids) + 1)
    first = ref.prefill(ids, cache)[0][-1]
    after = ref.decode(int(np.argmax(first)), cache)
    engine = np.load(tmp_path / "logits.npy")
    for e, r in zip(engine, (first, np.ravel(after))):
        assert np.abs(e - r).max() / (r.max() - r.min()) < 1e-4
    assert got["position"] == len(ids) + 1


def test_c_example_built_by_the_makefile_prints_the_reference_ids(exported, verifier):
    d = exported["c"]
    make = subprocess.run(["make", "-C", str(d), f"{NAME}_example"], capture_output=True, text=True, timeout=600)
    assert make.returncode == 0, make.stderr
    manifest = json.loads((d / "manifest.json").read_text())
    ids = manifest["example_ids"]
    run = subprocess.run([str(d / f"{NAME}_example"), str(d / f"{NAME}.weights"), "16", *map(str, ids)],
                         capture_output=True, text=True, timeout=120)
    assert run.returncode == 0, run.stderr
    assert [int(t) for t in run.stdout.split()] == reference_tokens(verifier, ids, 16, stop=False)
    # the library exports the ABI under NAME_ and nothing else
    nm = subprocess.run(["nm", "-D", "--defined-only", str(d / f"lib{NAME}.so")], capture_output=True, text=True)
    assert {ln.split()[-1] for ln in nm.stdout.splitlines() if " T " in ln} == {f"{NAME}_{f}" for f in ABI_FUNCTIONS}
    # a weights file of another design is refused by name, not run
    bad = d.parent / "bad.weights"
    data = bytearray((d / f"{NAME}.weights").read_bytes())
    data[24:88] = b"another-design".ljust(64, b"\0")
    bad.write_bytes(bytes(data))
    run = subprocess.run([str(d / f"{NAME}_example"), str(bad), "4", "1"], capture_output=True, text=True)
    assert run.returncode == 1 and "prepared for another design" in run.stderr
    # numbers that are none, or out of range, are refused by name (atoi read "abc" as token 0)
    weights = str(d / f"{NAME}.weights")
    for args, says in ((["3", "1", "abc"], "abc: is no token id"), (["3x", "1"], "N: must be a whole number"),
                       (["2", "-1"], "-1: is no token id"), (["2", "99999999"], "99999999: is no token id")):
        run = subprocess.run([str(d / f"{NAME}_example"), weights, *args], capture_output=True, text=True)
        assert run.returncode == 1 and says in run.stderr and not run.stdout, (args, run)


def test_manifest_names_the_engine_and_hashes_every_file(exported, record):
    for fmt, d in exported.items():
        manifest = json.loads((d / "manifest.json").read_text())
        expected = {"Makefile", f"{NAME}.c", f"{NAME}.h", f"{NAME}_example.c", f"{NAME}.weights", "tokenizer.json"}
        assert set(manifest["files"]) == expected | ({f"{NAME}.py"} if fmt == "python" else set())
        for fname, digest in manifest["files"].items():
            assert hashlib.sha256((d / fname).read_bytes()).hexdigest() == digest, fname
        best = record["best"]
        assert manifest["design_id"] == best["design_id"] == EngineDesign().design_id()
        assert manifest["design"] == best["design"] and manifest["abi_version"] == 1
        assert manifest["build"]["flags"] == list(FLAGS)
        assert manifest["campaign"]["verdict"] == "verified"
        assert manifest["campaign"]["decode_tok_s"] == best["decode_tok_s"]
        ver = manifest["verification"]
        assert ver["passed"] and ver["same_object_as_campaign"]
        assert {c["name"] for c in ver["checks"]} >= {"prefill_1", "greedy_0", "long_context_244"}
        assert all(c["passed"] and c["max_err"] < ver["tolerance"] for c in ver["checks"])
        source = (d / f"{NAME}.c").read_text()
        names = identifiers(source)   # error messages (string literals) keep the kf_ names, identifiers do not
        assert not {f"kf_{f}" for f in ABI_FUNCTIONS} & names and f"int {NAME}_prefill(" in source
        assert f"int {NAME}_prefill(void *e" in (d / f"{NAME}.h").read_text()


def test_weights_file_holds_the_prepared_tensors(exported, verifier):
    d = exported["c"]
    _, design_id, config, entries = export_runtime.read_weights(d / f"{NAME}.weights")
    c = verifier.model.config
    assert design_id == EngineDesign().design_id()
    assert config[:7] == (c.blocks, c.hidden, c.heads, c.kv_heads, c.head_dim, c.ffn, c.vocab)
    raw = (d / f"{NAME}.weights").read_bytes()
    tensors = prepare(verifier.model, EngineDesign())
    assert len(entries) == len(tensors)
    for (name, fmt, layout, rows, cols, offset, nbytes), t in zip(entries, tensors):
        assert (name.decode(), fmt, layout, rows, cols) == (t.name, FORMATS[t.format], LAYOUTS[t.layout], t.rows,
                                                            t.cols)
        assert offset % 64 == 0 and raw[offset:offset + nbytes] == np.ascontiguousarray(t.data).tobytes()


def test_an_engine_without_a_verified_record_is_refused(root, record, tmp_path, capsys):
    assert cli(tmp_path / "empty", "--format", "c", "--name", NAME, "--out", str(tmp_path / "a")) == 1
    assert "run `kfactory engine run tiny-llama` first" in capsys.readouterr().err
    assert not (tmp_path / "a").exists()
    # the same campaign, its record saying the design was rejected
    other = tmp_path / "data"
    shutil.copytree(root / "engines" / "tiny-llama", other / "engines" / "tiny-llama")
    best_json = other / "engines" / "tiny-llama" / "best.json"
    best = json.loads(best_json.read_text())
    rec = json.loads((best_json.parent / best["campaign"]).read_text())
    rec["best"]["verdict"] = "rejected"
    forged = other / "engines" / "tiny-llama" / "campaign-forged.json"
    forged.write_text(json.dumps(rec))
    best_json.write_text(json.dumps({**best, "campaign": str(forged)}))
    assert cli(other, "--format", "python", "--name", NAME, "--out", str(tmp_path / "b")) == 1
    assert "is not verified in its campaign record" in capsys.readouterr().err
    assert not (tmp_path / "b").exists()


def test_a_workspace_moved_or_copied_still_exports_its_engine(root, record, tmp_path, capsys):
    """best.json named its campaign record by an absolute path: a workspace copied elsewhere and the original
    moved, `export` said the record 'is gone' while it lay beside best.json."""
    from kfactory.engines.campaign import load_best

    moved = tmp_path / "moved"
    shutil.copytree(root / "engines", moved / "engines")
    best_json = moved / "engines" / "tiny-llama" / "best.json"
    assert json.loads(best_json.read_text())["campaign"] == Path(record["path"]).name
    assert load_best("tiny-llama", moved)["campaign"] == str(best_json.parent / Path(record["path"]).name)
    # written before by its absolute path, and that path gone: the record of that name beside best.json
    best = json.loads(best_json.read_text())
    best_json.write_text(json.dumps({**best, "campaign": str(tmp_path / "gone" / best["campaign"])}))
    # the record names the verified source by its absolute path in the old workspace: gone, as after a move
    record_json = best_json.parent / Path(record["path"]).name
    rec = json.loads(record_json.read_text())
    library = Path(rec["best"]["library"])
    assert library.is_relative_to(root) and (moved / library.relative_to(root)).with_suffix(".c").is_file()
    rec["best"]["library"] = str(tmp_path / "gone" / library.relative_to(root))
    record_json.write_text(json.dumps(rec))
    assert cli(moved, "--format", "python", "--name", NAME, "--out", str(tmp_path / "out")) == 0, \
        capsys.readouterr().err
    assert (tmp_path / "out").is_dir()


@pytest.mark.parametrize("args", [("--format", "c", "--name", "2fast"), ("--format", "python", "--name", "numpy"),
                                  ("--format", "torch", "--name", NAME),
                                  ("--format", "c", "--name", NAME, "--target", "cuda")])
def test_bad_usage_is_exit_2(root, tmp_path, capsys, args):
    assert cli(root, *args, "--out", str(tmp_path / "x")) == 2
    assert capsys.readouterr().err.startswith("kfactory export: ")
    assert not (tmp_path / "x").exists()


def test_chat_template_is_split_around_the_message_or_refused(verifier):
    tok = verifier.model.tokenizer
    split = chat_split(tok)
    assert split is not None
    message = "hello there"
    assert split["prefix"] + message + split["suffix"] == tok.chat([{"role": "user", "content": message}])
    trims = Tokenizer(tok.hf, tok.bos_id, tok.eos_id, tok.add_bos, "<|im_start|>{{ messages[0]['content'] | trim }}")
    with pytest.raises(ExportError, match="changes the message text"):
        chat_split(trims)
    assert chat_split(Tokenizer(tok.hf, tok.bos_id, tok.eos_id, tok.add_bos, None)) is None


def test_a_directory_of_another_export_is_refused(root, exported, capsys):
    assert cli(root, "--format", "c", "--name", "othername", "--out", str(exported["c"])) == 1
    assert f"holds another export ({NAME})" in capsys.readouterr().err
    assert not (exported["c"] / "othername.c").exists()


@pytest.mark.parametrize("design", [EngineDesign(prepack=False), EngineDesign(weights="f32", fuse_qkv=False)],
                         ids=lambda d: d.design_id())
def test_weights_file_round_trips_other_designs(verifier, tmp_path, design):
    """The ROWS layout (the GGUF's own blocks, memory-mapped) and float32 matrices write and read back too."""
    c = verifier.model.config
    tensors = prepare(verifier.model, design)
    fields = (c.blocks, c.hidden, c.heads, c.kv_heads, c.head_dim, c.ffn, c.vocab, c.rope_base, c.rms_eps)
    size = write_weights(tmp_path / "w.weights", tensors, design.design_id(), fields)
    data, design_id, config, entries = export_runtime.read_weights(tmp_path / "w.weights")
    assert size == len(data) and design_id == design.design_id()
    assert config == pytest.approx(fields)
    assert [e[0].decode() for e in entries] == [t.name for t in tensors]
    for (_, _, _, _, _, offset, nbytes), t in zip(entries, tensors):
        assert bytes(data[offset:offset + nbytes]) == np.ascontiguousarray(t.data).tobytes()


def test_a_library_exporting_more_than_the_abi_is_refused(exported, tmp_path):
    source = (exported["c"] / f"{NAME}.c").read_text()
    argv = ["{cc}", "-x", "c", *FLAGS, "-o", "{out}", f"{NAME}.c", "-x", "none", *LINK]
    (tmp_path / f"{NAME}.c").write_text(source)
    check_library(tmp_path, [argv], NAME)                    # the export's own source passes
    (tmp_path / f"{NAME}.c").write_text(source + "\nint leaked_table[4] = {1, 2, 3, 4};\n")
    with pytest.raises(ExportError, match="leaked_table"):
        check_library(tmp_path, [argv], NAME)


def test_exporting_a_spinning_design_says_its_threads_hold_their_cores(verifier, tmp_path):
    """A spinning winner (here the only verified design) is exported as it was measured, and the export says
    what its idle threads cost and how to make them wait; a design that waits bounded says nothing of it."""
    from kfactory.engines.export import export_engine

    said = {}
    for design in (EngineDesign(threads=2, spin=True), EngineDesign(threads=2, wait="bounded")):
        data = tmp_path / design.design_id()
        campaign = Campaign("tiny-llama", 1, data_dir=data, verifier=verifier)
        campaign.results.append(campaign.evaluate(design))
        assert campaign.write("t")["best"]["design_id"] == design.design_id()
        notes: list[str] = []
        export_engine("tiny-llama", "python", NAME, data / "out", data, verifier=verifier, progress=notes.append)
        said[design.spin] = [n for n in notes if n.startswith("note: ")]
        manifest = json.loads((data / "out" / "manifest.json").read_text())
        assert manifest["omp_wait_policy"] == ("active" if design.spin else "")
    (note,) = said[True]
    assert "spins" in note and "GOMP_SPINCOUNT=300000" in note and "OMP_WAIT_POLICY=passive" in note
    assert said[False] == []


def test_a_relative_out_and_an_export_again_into_the_same_directory(root, record, tmp_path, monkeypatch):
    """--out relative to the working directory, and the module opened by a relative path (the docs' example):
    the compiler runs inside the export, so both must be made absolute first. An export again into the same
    directory removes the library the earlier one's module built (of the earlier design, it would refuse the new
    weights) and keeps the user's own files; a library is built again when its sources change, not when only
    their times do. A stage that an export killed midway left beside the directory is removed by the next."""
    monkeypatch.chdir(tmp_path)
    # the stage an export killed midway left (its maker, a pid no process can have, is dead)
    killed = tmp_path / "rel" / f".py.kf-export-{scratch.host_tag()}-{scratch.pid_namespace()}-{10**20}-abcd"
    killed.mkdir(parents=True)
    os.utime(killed, (time.time() - 120, time.time() - 120))
    assert cli(root, "--format", "python", "--name", NAME, "--out", "rel/py") == 0
    d = tmp_path / "rel" / "py"
    assert sorted(p.name for p in (tmp_path / "rel").iterdir()) == ["py"], "a stage was left beside the export"

    def open_module() -> None:
        proc = subprocess.run([sys.executable, "-I", "-c", CHILD, "py", PROMPT, "2", str(tmp_path / "l.npy")],
                              cwd=tmp_path / "rel", capture_output=True, text=True, timeout=600)
        assert proc.returncode == 0, proc.stderr

    open_module()
    lib = d / f"lib{NAME}.so"
    assert lib.is_file()
    (d / "notes.txt").write_text("the user's")
    assert cli(root, "--format", "python", "--name", NAME, "--out", "rel/py") == 0
    assert not lib.exists() and (d / "notes.txt").read_text() == "the user's"
    assert sorted(p.name for p in (tmp_path / "rel").iterdir()) == ["py"], "a stage was left beside the export"
    open_module()
    built = lib.stat().st_mtime_ns
    source = d / f"{NAME}.c"
    later = built + 5_000_000_000   # a clock skew: the sources are what they were, nothing is built again
    os.utime(source, ns=(later, later))
    open_module()
    assert lib.stat().st_mtime_ns == built
    source.write_text(source.read_text() + "/* edited */\n")   # a source that changed is built again
    open_module()
    assert lib.stat().st_mtime_ns > built


@pytest.mark.parametrize("under", ["", "sub"])
def test_an_out_that_is_a_file_is_refused_before_the_verification(root, record, tmp_path, capsys, under):
    afile = tmp_path / "afile"
    afile.write_text("mine")
    out = afile / under if under else afile
    assert cli(root, "--format", "c", "--name", NAME, "--out", str(out)) == 1
    err = capsys.readouterr().err
    assert f"{afile} is a file, not a directory" in err and "verifying" not in err, err
    assert afile.read_text() == "mine"
