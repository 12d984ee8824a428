# AccelPact: every target does its own set-up through `install`, which is idempotent.
SHELL := /bin/bash
VENV  ?= .venv
PY    := $(VENV)/bin/python
PIP   := $(PY) -m pip --disable-pip-version-check -q
STAMP := $(VENV)/.installed
WORKERS ?= 2

.PHONY: install python java fabric test lint pytest modelcheck check demo bench clean campaign campaign-spares campaign-full qualify

# Everything: the Python environment, a Java runtime for TLC (the model checks, and the trace
# validation the test suite runs) and iproute2 for the emulated nodes of the chaos tests (as root;
# without root those tests say why they skip). `make demo` needs the Python environment only.
install: python java fabric

python: $(STAMP)

java:
	@command -v java >/dev/null 2>&1 || { echo "java missing: installing a Java runtime with apt"; \
	  apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq default-jre-headless >/dev/null; }

fabric:
	@command -v ip >/dev/null 2>&1 || [ "$$(id -u)" != 0 ] || { echo "ip missing: installing iproute2 with apt"; \
	  apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq iproute2 >/dev/null; }

$(STAMP): pyproject.toml
	@test -x $(PY) || python3 -m venv $(VENV)
	@# torch first, pinned: the CPU wheel on local disk (any other spec downloads gigabytes)
	@$(PY) -c "import torch, sys; sys.exit(torch.__version__.split('+')[0] != '2.13.0')" 2>/dev/null || $(PIP) install torch==2.13.0
	@$(PIP) install -e '.[dev]'
	@touch $(STAMP)
	@echo "installed: $$($(PY) -c 'import torch, transitions; print("torch", torch.__version__, "transitions", transitions.__version__)')"

lint: install
	$(VENV)/bin/ruff check .

pytest: install
	$(PY) -m pytest -q

# MC2 and MC3 side by side, one TLC worker each (check's default: one run per worker).
modelcheck: install
	$(VENV)/bin/accelpact check --ranks 2 3 --workers $(WORKERS)

# What CI runs: lint, the whole test suite, and the 2- and 3-rank model checks (with them the
# membership model MC3, spec/membership/).
test: lint pytest modelcheck

# The full model checks: 2, 3 and 4 ranks, the membership change with 3 and 4 positions
# (spec/Membership.tla), every mutant and every witness (spec/witnesses/, spec/membership/, each
# must be reached), and conformance (guards generated from the table, then edges). The 4-rank model
# (2x2 HSDP, either pair may fail) is the slow one; see the README for measured times. The rank
# models run one at a time with every worker (--jobs 1: MC4 was measured on 2 workers); the 30
# mutants and witnesses (18 and 12; the membership model's 16 and 10 after them) side by side.
check: install
	$(VENV)/bin/accelpact check --ranks 2 3 4 --membership 3 4 --workers $(WORKERS) --jobs 1 --timeout 3600
	$(VENV)/bin/accelpact check --mutants --conformance --workers $(WORKERS)

demo: python
	$(VENV)/bin/accelpact demo

# Every benchmark at its quick settings: about 17 minutes on 2 shared cores (the torchrun jobs of
# restart/rankloss/goodput dominate; each script's --help gives its full run). torchft 0.2.0 (peer and
# overhead benches only) goes in without its torch pin; torch is checked to stay 2.13.0.
BENCH_PEERS := opentelemetry-api>=1.39.0 opentelemetry-sdk>=1.39.0 opentelemetry-exporter-otlp-proto-http>=1.39.0
bench: install
	@$(PY) -c "import matplotlib" 2>/dev/null || $(PIP) install matplotlib
	@$(PY) -c "import torchft" 2>/dev/null || { $(PIP) install --no-deps torchft==0.2.0 && $(PIP) install $(BENCH_PEERS); }
	@$(PY) -c "import torch, sys; sys.exit(torch.__version__.split('+')[0] != '2.13.0')" || { echo "torch is no longer 2.13.0"; exit 1; }
	$(PY) bench/rebind.py --layers 4 32 --repeats 50
	$(PY) bench/repair.py --faults 3 --data-timeout 2
	$(PY) bench/guard.py --updates 60
	$(PY) bench/deferred_check.py --updates 120
	$(PY) bench/overhead.py --quick
	$(PY) bench/torchft_peer.py --quick
	$(PY) bench/restart.py --quick
	$(PY) bench/rankloss.py --quick
	$(PY) bench/goodput.py --quick
	$(PY) bench/ddp_buckets.py --updates 20
	$(PY) bench/soak.py --recoveries 50
	$(PY) bench/timeouts.py --updates 100 --faults 1 --loads quiet

clean:
	rm -rf $(VENV) .pytest_cache .ruff_cache .hypothesis *.egg-info

# Property-based fault campaigns: >= 200 real-runtime schedules (4 CPU ranks, TLC on every trace;
# ~15 s each on 2 cores, so about an hour) and thousands of pure-simulation schedules. SEED replays
# a campaign; ENVELOPE=paper runs the paper's envelope (Preserve at committed boundaries only);
# SPARES=S runs every schedule with S hot spares (4 + S processes: a killed rank is replaced).
CAMPAIGN_EXAMPLES ?= 200
campaign: install
	$(PY) -m accelpact.testing.campaign --sim --campaign --examples 5000 $(if $(SEED),--seed $(SEED))
	$(PY) -m accelpact.testing.campaign --campaign --examples $(CAMPAIGN_EXAMPLES) \
	  --summary campaign-summary.json $(if $(SEED),--seed $(SEED)) $(if $(ENVELOPE),--envelope $(ENVELOPE)) \
	  $(if $(SPARES),--spares $(SPARES))

# The spares profile alone: skip/late/kill schedules on 4 active ranks + SPARES (default 2) spare
# processes, every failing schedule recorded (and its logs kept in runs/campaign-spares/failed),
# the share of fired faults recovered in memory in campaign-spares-summary.json. About 30-60 s
# per schedule on 2 shared cores: 40 schedules take 20-40 minutes.
SPARES_EXAMPLES ?= 40
campaign-spares: install
	$(PY) -m accelpact.testing.campaign --campaign --examples $(SPARES_EXAMPLES) --spares $(or $(SPARES),2) \
	  --keep-going --keep-failed runs/campaign-spares/failed --summary campaign-spares-summary.json \
	  $(if $(SEED),--seed $(SEED))

# The same with a fully sharded job: FSDP2 over the 4 ranks, no replica, neighbour copies
# (Config.replicate="neighbour"): a killed rank's state comes from its ring successor's memory.
campaign-full: install
	$(PY) -m accelpact.testing.campaign --campaign --examples $(SPARES_EXAMPLES) --spares $(or $(SPARES),2) \
	  --profile fsdp2-full --keep-going --keep-failed runs/campaign-full/failed \
	  --summary campaign-full-summary.json $(if $(SEED),--seed $(SEED))

# Measure which recovery actions work on this platform and write the envelope file the runtime
# obeys (~/.cache/accelpact/envelope.json; about 5 minutes on 2 cores, QUICK=1 about 2).
qualify: install
	$(VENV)/bin/accelpact qualify $(if $(QUICK),--quick)

# Real link cuts between 2 emulated nodes (network namespaces; needs root): a bounded campaign
# (<= 5 min) that prints one row per cut (where it landed, what the runtime did, the bitwise verdict)
# and the fraction of cuts recovered in memory. The workers obey a qualified envelope, as a user
# would: the default envelope file if usable here, else `accelpact qualify --quick` first (134 s
# here, outside the budget); ENVELOPE=builtin|permissive|<file> overrides. nftables is installed
# for the bridge drop rule if missing.
# Then chaos-nodeloss (<= 4 min, about 1.5 here): node 1 of 3 lost for good (killed; then off the
# fabric and killed), the spare node takes over its ranks, bitwise.
.PHONY: chaos chaos-nodeloss
chaos: install
	@command -v nft >/dev/null 2>&1 || { echo "nft missing: installing nftables with apt"; \
	  apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq nftables >/dev/null; }
	$(PY) -m accelpact.chaos campaign --budget-s 290 --out runs/chaos $(if $(ENVELOPE),--envelope $(ENVELOPE))
	$(MAKE) --no-print-directory chaos-nodeloss

chaos-nodeloss: install
	$(PY) -m accelpact.chaos nodeloss --budget-s 240 --out runs/chaos
