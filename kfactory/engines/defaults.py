"""The engine campaign's defaults that the command line shows in its help: a module of constants, importing
nothing, so that building the `kfactory` parser (every command's start) does not import the engine's design and
showdown modules (0.15 s of imports, most of which a query command needs later anyway: `kfactory best` starts
0.04 s sooner)."""

#: showdown rounds by default (`kfactory engine run --showdown N`); the most contenders; a design contends when
#: the fastest's decode tok/s is at most MARGIN times its own (or the campaign's noise figure, when larger).
#: 9 rounds: at 2 threads one round's ratio of two designs spread x0.92-x1.30 on smollm2-135m (bench/engine_ab.py,
#: 12 rounds), and a 5-round showdown put vnni x1.071 ahead of vnni24 where 12 rounds put vnni24 ahead
#: (docs/engines.md, vnni24)
ROUNDS, CONTENDERS, MARGIN = 9, 3, 1.15
#: the timing rounds before it that `kfactory engine run` (and `kfactory submit engine:MODEL`) asks for by default:
#: the measurement after each design's verification and one more over all verified designs in turn
TIMING_ROUNDS = 2
#: the most threads a design may ask for (the ABI takes any count; the space stops here)
MAX_THREADS = 64
