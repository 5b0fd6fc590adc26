# Two commands do everything: `make demo` and `make test`. Both set up .venv first:
# `make demo` installs what refinery runs with (`make setup`), `make test` adds the test tools
# and the other trainers' readers the export tests open files with (`make setup-test`).
PY ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed
TEST_STAMP := $(VENV)/.installed-test

.PHONY: setup setup-test demo test bench clean

setup: $(STAMP)

setup-test: $(TEST_STAMP)

# The CPU torch wheel first (pip finds it on local disk where the machine has one);
# a plain `torch` requirement would otherwise pull a multi-GB CUDA build.
$(STAMP): pyproject.toml
	test -x $(BIN)/python || $(PY) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip
	$(BIN)/python -m pip install -q "torch==2.13.0" || $(BIN)/python -m pip install -q "torch>=2.6" --index-url https://download.pytorch.org/whl/cpu || true
	$(BIN)/python -m pip install -q -e .
	# compiled kernels once, before any run starts workers that would each compile them
	$(BIN)/refinery warmup
	touch $(STAMP)

# test tools (pytest, httpx, moto, selenium) and the readers tests/test_export*.py check exports
# with: megatron-core, datatrove, datasets, transformers, then OLMo-core and Streaming without
# their pins (see pyproject.toml)
$(TEST_STAMP): $(STAMP) pyproject.toml
	$(BIN)/python -m pip install -q -e ".[dev,export-test]"
	$(BIN)/python -m pip install -q --no-deps ai2-olmo-core==3.0.0 mosaicml-streaming==0.13.0 cached-path==1.8.10
	touch $(TEST_STAMP)

# curate the real crawl sample -> train a tokenizer on the result -> tokenize and pack -> train
demo: setup
	$(BIN)/refinery run pipelines/demo.yaml --out runs/demo --workers 2
	$(BIN)/refinery stats runs/demo
	$(BIN)/refinery tokenizer train runs/demo/merged --kind bpe --vocab-size 4096 --out runs/demo-tok
	$(BIN)/refinery tokenizer report runs/demo-tok runs/demo/merged
	$(BIN)/refinery run pipelines/demo-pack.yaml --out runs/demo-pack --workers 2
	$(BIN)/refinery stats runs/demo-pack
	$(BIN)/refinery train pipelines/train-tiny.yaml

test: setup-test
	$(BIN)/python -m pytest -q tests

# a comparison against a commit you choose (--base): run by hand, listed as skipped by `make bench`
BENCH_NEEDS_ARGS := tests/benchmarks/bench_kernels_vs_commit.py

bench: setup
	$(BIN)/python -m pip install -q -e ".[bench]"
	# every benchmark runs (one failing does not hide the others); the failed ones are listed at the
	# end, and the skipped ones: those needing an argument (BENCH_NEEDS_ARGS) and those that say
	# they were skipped (bench_gpu.py without CUDA)
	@mkdir -p runs/bench; failed=""; skipped=""; for b in tests/benchmarks/bench_*.py; do echo "== $$b"; \
	case " $(BENCH_NEEDS_ARGS) " in *" $$b "*) skipped="$$skipped $$b(needs-arguments)"; continue;; esac; \
	log=runs/bench/$$(basename $$b .py).log; { $(BIN)/python $$b; echo $$? > $$log.rc; } 2>&1 | tee $$log; \
	if [ "$$(cat $$log.rc)" != 0 ]; then failed="$$failed $$b"; \
	elif grep -q "needs a CUDA GPU; skipped" $$log; then skipped="$$skipped $$b(no-CUDA)"; fi; done; \
	if [ -n "$$skipped" ]; then echo "skipped:$$skipped"; fi; \
	if [ -n "$$failed" ]; then echo "failed:$$failed"; exit 1; fi

clean:
	rm -rf runs .pytest_cache
