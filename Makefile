# kfactory: the two commands a newcomer needs are `make demo` and `make test`.
PYTHON ?= python3
BUDGET ?= 40

.PHONY: install demo test proto bench clean

install:
	$(PYTHON) -m pip install -q -e ".[dev]"

demo: install
	kfactory run softmax --target cpu --budget $(BUDGET) --json out.json

test: install
	$(PYTHON) -m pytest -q

proto:
	$(PYTHON) scripts/gen_proto.py

bench: install
	$(PYTHON) bench/pipeline_overhead.py

clean:
	rm -rf reports out.json .pytest_cache build *.egg-info
