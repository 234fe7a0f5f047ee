# serveproto: the two commands of the README.
#   make serve   start the decision server on the default model (HOST, PORT, MODEL, THREADS, DEBIAS, PRECISION,
#                LOG_DECISIONS, PIN_SLOTS, STRICT, MMPROJ, SERVEPROTO_API_KEY)
#   make test    run the tests: every tier, lint first (.ci/run runs this one)
#   make test-quick  the quick tier alone (tests/protocol, tests/gateway: no engine process, no model; under a
#                minute); tests/engines and tests/e2e start the engines (README, "Tests")
# Both create .venv, build the engines and fetch the default model; a second run reuses all of it.

PYTHON ?= python3
VENV   := .venv
PY     := $(VENV)/bin/python
HOST   ?= 127.0.0.1
PORT   ?= 8000
MODEL  ?=
THREADS ?=
DEBIAS ?=
PRECISION ?=
LOG_DECISIONS ?=
PIN_SLOTS ?=
STRICT ?=
MMPROJ ?=
export SERVEPROTO_CACHE ?= $(HOME)/.cache/serveproto

.PHONY: serve test test-quick lint venv venv-test engines engines-stock model browser nginx clean

serve: venv engines model
	$(VENV)/bin/serveproto serve --host $(HOST) --port $(PORT) $(if $(MODEL),--model $(MODEL)) $(if $(THREADS),--threads $(THREADS)) $(if $(DEBIAS),--debias $(DEBIAS)) $(if $(PRECISION),--precision $(PRECISION)) $(if $(LOG_DECISIONS),--log-decisions $(LOG_DECISIONS)) $(if $(PIN_SLOTS),--pin-slots $(PIN_SLOTS)) $(if $(STRICT),--strict) $(if $(MMPROJ),--mmproj $(MMPROJ))

test: lint engines engines-stock model browser nginx
	$(VENV)/bin/pytest $(PYTEST_ARGS)

# Selected by folder, so a test that starts an engine cannot land here unmarked: tests/conftest.py fails any
# test of these folders that starts one (a serveproto* program or a file of engines/bin).
test-quick: venv-test
	$(VENV)/bin/pytest -q tests/protocol tests/gateway $(PYTEST_ARGS)

# ruff (lint + format check) on the paths listed in pyproject.toml's [tool.ruff] include, and
# mypy --strict on serveproto/ and gateway/ ([tool.mypy]); `ruff format` and `ruff check --fix` repair most of it.
lint: venv-test
	$(VENV)/bin/ruff check
	$(VENV)/bin/ruff format --check
	$(VENV)/bin/mypy

# serve needs the [server] extra; test adds the [test] extra (pytest, trio, numpy, the SDK, selenium, ruff, mypy...)
venv: $(VENV)/.installed
venv-test: $(VENV)/.installed-test

$(VENV)/.installed: setup.cfg pyproject.toml
	@echo "serveproto: installing the Python packages into $(VENV) (first run only, about a minute)"
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q -e '.[server]'
	touch $@

$(VENV)/.installed-test: $(VENV)/.installed
	@echo "serveproto: installing the test packages into $(VENV) (first run only)"
	$(PY) -m pip install -q -e '.[server,test]'
	touch $@

engines: venv
	$(MAKE) -C engines all

# The llama engine on stock llama.cpp, no patch applied (engines/bin/serveproto-llama-stock, its own llama.cpp
# build in the cache; engines/llama/patches/README.md): tests/engines/test_llama_stock.py runs it.
engines-stock: venv
	$(MAKE) -C engines all LLAMA_PATCHES=none

model: venv
	$(PY) -m gateway.engine.default_model
	$(PY) -m gateway.engine.sparrow_model sparrow-nano-general
	$(PY) -m gateway.engine.sparrow_model sparrow-nano-robot

# Headless Chromium for the System One page tests (Debian's packages; skipped tests without it).
browser:
	@command -v chromium >/dev/null && command -v chromedriver >/dev/null || \
	  (apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium chromium-driver >/dev/null) || \
	  echo "chromium could not be installed: the page tests will skip"

# nginx for the balancer's e2e test (tests/e2e/test_balancer.py, docs/http-api.md's configuration): Debian's
# package unpacked into the cache, not installed (no service started, no root needed once apt has its lists; the
# test finds it there when nginx is not on PATH). Without it that test skips, and fails under CI=true.
NGINX := $(SERVEPROTO_CACHE)/nginx/usr/sbin/nginx
nginx:
	@command -v nginx >/dev/null || test -x $(NGINX) || \
	  (d=$$(mktemp -d) && cd $$d && \
	   (apt-get download -qq nginx 2>/dev/null || (apt-get update -qq && apt-get download -qq nginx)) && \
	   mkdir -p $(SERVEPROTO_CACHE)/nginx && dpkg-deb -x nginx_*.deb $(SERVEPROTO_CACHE)/nginx && rm -rf $$d && \
	   $(NGINX) -v) || \
	  echo "nginx could not be fetched: tests/e2e/test_balancer.py will skip (and fail under CI=true)"

clean:
	$(MAKE) -C engines clean
	rm -rf $(VENV) build *.egg-info
