"""Inference engines: a whole model's forward as one generated C library (issue 26).

    design.py    EngineDesign (the engine-level choices), space(), design_id()
    codegen.py   generate(design, config) -> one C source (the ABI is documented there and in docs/engines.md)
    build.py     build(source) -> BuildResult (cc, cached by content; a compile failure is a result)
    prepare.py   the tensors a design reads, from the GGUF model
    runner.py    EngineRunner: the library in a child process (child.py), typed faults, timing
    verify.py    Verifier.verify(design, so) -> Verdict against the float64 reference (refcache.py)
    defaults.py  the campaign's defaults that the CLI's help shows (rounds, margin, threads); imports nothing

Nothing here loads a generated library into the calling process: abi.py is imported by the child only.
"""
