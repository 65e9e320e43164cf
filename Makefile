# Stockade: `make run` serves, `make test` runs every test; each sets the machine up first
# (scripts/setup.sh: quick when nothing is missing).
.PHONY: setup-run setup-test run test lint proto bench bench-compare fuzz statdir

setup-run:
	scripts/setup.sh run

setup-test:
	scripts/setup.sh test

run: setup-run
	STOCKADE_ENGINE=$$(cat .venv/.stockade-engine) .venv/bin/stockade serve --no-auth

# Three pytest processes side by side: the unit tests, and the integration tests on Podman and
# on Docker (scripts/run_tests.py; arguments through TEST_ARGS). One process: `.venv/bin/pytest`.
test: setup-test lint
	.venv/bin/python scripts/run_tests.py $(TEST_ARGS)

# Run by `make test` before the tests: CI enforces them.
lint: setup-test
	.venv/bin/ruff check .
	.venv/bin/ruff format --check .
	.venv/bin/mypy -p stockade -p bench
	.venv/bin/lint-imports --no-cache

# The capture's stat loop in C (supervisor/sandboxes/snapshots/statdir.py loads it; without
# it, captures stat in Python). scripts/setup.sh runs this when the source is newer.
STATDIR = supervisor/sandboxes/snapshots
statdir:
	cc -O2 -Wall -Wextra -Werror -shared -fPIC -o $(STATDIR)/_statdir.so $(STATDIR)/statdir.c

proto:
	.venv/bin/python scripts/gen_proto.py

# Figures side by side: Stockade, the engine CLIs and llm-sandbox, on Podman and Docker.
# Arguments through BENCH_ARGS, e.g. `make bench BENCH_ARGS="--quick --engine docker"`.
bench: setup-test
	.venv/bin/pip install --quiet -e '.[bench]'
	.venv/bin/python -m bench $(BENCH_ARGS)

# BASE's supervisor against this tree's, in one run: warm `exec true` and supervisor CPU per call
# in interleaved rounds, e.g. `make bench-compare BASE=c077f17 BENCH_ARGS="--n 3000 --rounds 30"`.
bench-compare: setup-test
	@test -n "$(BASE)" || { echo "make bench-compare needs BASE=<git revision>" >&2; exit 2; }
	.venv/bin/python -m bench --compare $(BASE) $(BENCH_ARGS)

# Coverage-guided fuzzing of every parser that takes hostile input (fuzz/, docs/security.md
# "Fuzzing"): FUZZ_SECONDS per target (8 targets: 90 s each is 12 minutes), niced; what adds
# coverage is merged into fuzz/corpus/, a crash saved in fuzz/crashes/ and the exit non-zero.
# e.g. `make fuzz FUZZ_SECONDS=300 FUZZ_TARGETS="connect files"`.
FUZZ_SECONDS ?= 90
fuzz: setup-test
	.venv/bin/pip install --quiet -e '.[fuzz]'
	FUZZ_SECONDS=$(FUZZ_SECONDS) nice -n 10 .venv/bin/python -m fuzz $(FUZZ_TARGETS)
