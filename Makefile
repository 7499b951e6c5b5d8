# Two commands do everything on a fresh machine: `make demo` and `make test`.
# Both create .venv/ at the repository root from the locked dependencies (uv.lock) first.

PYTHON ?= python3
VENV := .venv
UV_VERSION := 0.13.8
STAMP := $(VENV)/.synced

.PHONY: test-deployed demo test test-unprivileged test-fast lint proto proto-check bench chaos cluster fuzz up clean help

help:
	@echo "make demo   - start the platform on embedded defaults and process sample photos, a PDF, an ODT, scans (OCR) and a generated phone video clip"
	@echo "make test   - the whole test suite (real Postgres, NATS, libvips)"
	@echo "make test-unprivileged - tests/security again as the unprivileged user hmtest"
	@echo "make test-deployed - the shared platform's e2e tests through PgBouncer and on S3 (moto)"
	@echo "make lint   - ruff, mypy, buf lint, stub drift, deploy linters"
	@echo "make fuzz   - the REST API fuzzed against its OpenAPI document (schemathesis), 300 examples an operation"
	@echo "make bench  - benchmarks (ratios against baselines measured in the same run)"
	@echo "make chaos  - 1,000 jobs while workers, the relay, NATS and Postgres are killed (JOBS=N)"
	@echo "make cluster - 1,000 jobs on a 3-node NATS cluster losing its stream leader, then its quorum (JOBS=N)"
	@echo "make up     - run the platform until Ctrl-C"
	@echo "make proto  - regenerate the gRPC stubs"

$(STAMP): pyproject.toml uv.lock
	@test -x $(VENV)/bin/python || $(PYTHON) -m venv $(VENV)
	@$(VENV)/bin/python -m pip --version >/dev/null 2>&1 || $(VENV)/bin/python -m ensurepip --upgrade >/dev/null
	@$(VENV)/bin/python -m pip install --quiet --disable-pip-version-check uv==$(UV_VERSION)
	@UV_PROJECT_ENVIRONMENT=$(VENV) $(VENV)/bin/uv sync --frozen --inexact --quiet --python $(VENV)/bin/python
	@touch $(STAMP)

# Debian packages the platform runs for real. The docworker's: LibreOffice (headless, without the
# GUI) with the Python-UNO bridge its listeners are driven through, the metric-compatible fonts
# that keep office page counts (Carlito for Calibri, Caladea for Cambria, Liberation for Arial,
# Times New Roman and Courier New), and the fonts of the other scripts, without which LibreOffice
# draws every character no installed font has as an empty box (issue 15): fonts-noto-cjk (Noto
# Sans and Serif CJK, Simplified and Traditional Chinese, Japanese, Korean; 55 MB download, 91 MB
# installed) and fonts-noto-core (Noto Sans and Serif of Arabic, Hebrew, Devanagari, Thai and
# the other living scripts: Bengali, Tamil, Georgian, Armenian, Ethiopic, Khmer, ...; 12 MB
# download, 43 MB installed). Smaller per-script packages (fonts-thai-tlwg, fonts-lohit-deva,
# DejaVu's Arabic and Hebrew: about 4 MB) would leave every other script boxed, and
# fonts-wqy-zenhei (16 MB) draws Japanese kanji in Chinese forms. deploy/check_policy.py keeps
# the docworker image equal to this list. The
# OCR engine's (issue 6, hypermedia/engines/ocr/): tesseract with orientation detection and the languages
# of the OCR corpus. Installed when missing and running as root, otherwise the script says what
# to install.
DOCWORKER_PACKAGES := libreoffice-writer-nogui libreoffice-calc-nogui libreoffice-impress-nogui \
	python3-uno fonts-crosextra-carlito fonts-crosextra-caladea fonts-liberation2 fonts-noto-cjk \
	fonts-noto-core
OCR_PACKAGES := tesseract-ocr tesseract-ocr-osd tesseract-ocr-eng tesseract-ocr-deu tesseract-ocr-fra \
	tesseract-ocr-ita tesseract-ocr-spa tesseract-ocr-por
DEBIAN_PACKAGES := $(DOCWORKER_PACKAGES) $(OCR_PACKAGES)
# What the suite needs besides: clamd for the virus-scan tests, and libseccomp's binding for the
# system python3 that loads the worker seccomp profile (tests/security/test_worker_seccomp_profile.py),
# PgBouncer for the platform behind a transaction pooler (tests/e2e/test_pgbouncer.py), and
# iproute2 and util-linux for workers on hosts of their own (tests/e2e/test_other_hosts.py).
DEBIAN_TEST_PACKAGES := $(DEBIAN_PACKAGES) clamav-daemon python3-seccomp chromium chromium-driver pgbouncer \
	iproute2 util-linux mount

demo: $(STAMP)
	@scripts/ensure_debian_packages.sh $(DEBIAN_PACKAGES)
	$(VENV)/bin/python scripts/demo.py

test: $(STAMP)
	@scripts/ensure_debian_packages.sh $(DEBIAN_TEST_PACKAGES)
	$(VENV)/bin/python -m pytest -q -p no:cacheprovider --durations=30
	@$(MAKE) --no-print-directory test-unprivileged

# The security suite a second time, as the unprivileged user hmtest (created when missing): a
# test skipped there for lack of root fails (issue 18 item 6; scripts/test_unprivileged.sh).
test-unprivileged: $(STAMP)
	scripts/test_unprivileged.sh

# The e2e tests of the shared platform once more, on a deployment's infrastructure: every pool
# through PgBouncer in transaction pooling and the S3 backend against a moto endpoint
# (tests/e2e/deployed.py; issue 24 items 2 and 3).
test-deployed: $(STAMP)
	@scripts/ensure_debian_packages.sh $(DEBIAN_TEST_PACKAGES)
	HM_TEST_PLATFORM=deployed $(VENV)/bin/python -m pytest -q -p no:cacheprovider tests/e2e

lint: $(STAMP)
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .
	$(VENV)/bin/mypy
	$(VENV)/bin/buf lint proto
	$(MAKE) --no-print-directory proto-check
	PATH="$(CURDIR)/$(VENV)/bin:$$PATH" bash deploy/lint.sh

proto: $(STAMP)
	scripts/gen_protos.sh

# Regenerate into a temporary tree and fail when the committed stubs differ.
proto-check: $(STAMP)
	@tmp=$$(mktemp -d) && scripts/gen_protos.sh $$tmp >/dev/null && \
	  for f in $$(cd $$tmp && find hypermedia -name '*_pb2*' -o -name '*.pyi' | sort); do \
	    cmp -s $$tmp/$$f $$f || { echo "stub drift: $$f (run make proto)"; rm -rf $$tmp; exit 1; }; \
	  done; rm -rf $$tmp; echo "stubs up to date"

# What the benchmarks need: the engines' packages (office_to_pdf and OCR are skipped without them)
# and the ffmpeg command line, bench/media.py's baseline.
BENCH_PACKAGES := $(DEBIAN_PACKAGES) ffmpeg

bench: $(STAMP)
	@scripts/ensure_debian_packages.sh $(BENCH_PACKAGES)
	$(VENV)/bin/python bench/run.py

JOBS ?= 1000
chaos: $(STAMP)
	$(VENV)/bin/python -m tests.chaos.harness --jobs $(JOBS)

# A 3-node NATS cluster losing its stream leader, then its quorum, under 1,000 no-op jobs (make
# test runs 300): every job completed and settled once (tests/e2e/test_nats_cluster.py).
cluster: $(STAMP)
	HM_CLUSTER_JOBS=$(JOBS) $(VENV)/bin/python -m pytest -q -p no:cacheprovider tests/e2e/test_nats_cluster.py

# The REST API fuzzed against its OpenAPI document at length (make test runs 8 examples an
# operation; this 300): no 5xx, every answer as documented (tests/e2e/test_openapi_fuzz.py).
fuzz: $(STAMP)
	@scripts/ensure_debian_packages.sh $(DEBIAN_TEST_PACKAGES)
	HM_FUZZ_EXAMPLES=$(or $(EXAMPLES),300) $(VENV)/bin/python -m pytest -q -p no:cacheprovider tests/e2e/test_openapi_fuzz.py

up: $(STAMP)
	$(VENV)/bin/hypermedia up

clean:
	rm -rf .hypermedia demo-output
