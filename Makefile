# trainjob-admission: two commands for a fresh machine.
#   make demo   installs and runs the embedded demo (server + sample TrainJobs, default bundle)
#   make test   installs and runs every test tier this machine can run (unit, server, cluster)
PYTHON ?= python3
VENV   := .venv
PY     := $(VENV)/bin/python
PIP    := $(VENV)/bin/pip
STAMP  := $(VENV)/.installed

.PHONY: install demo test test-unit test-server test-cluster bench lint clean images samples
.DEFAULT_GOAL := help

help:
	@echo "make demo   - install, then run the webhook demo on loopback with the default bundle"
	@echo "make test   - install, then run the unit, server and (with Go) cluster tests"
	@echo "make test-cluster - build the Go control plane, run the cluster tests"
	@echo "make lint   - pyflakes over the code, tests, bench and hack (part of make test)"
	@echo "make images - the real node's pause, OpenMPI and service images from Debian packages (root; cached by content)"
	@echo "make bench  - engine and server benchmarks, each side by side with its baseline (bench/cluster.py: on the control plane)"
	@echo "make samples - copy examples/ (the source) to webhook/samples, the sample files the wheel ships"

$(STAMP): pyproject.toml requirements.lock
	$(PYTHON) -m venv $(VENV)
	$(PIP) install -q --upgrade pip==25.3
	$(PIP) install -q -r requirements.lock
	$(PIP) install -q --no-deps -e .
	touch $(STAMP)

install: $(STAMP)

demo: $(STAMP)
	$(VENV)/bin/trainjob-admission demo

test: $(STAMP) lint
	$(PY) -m pytest tests/unit tests/server -q
	$(MAKE) test-cluster

test-unit: $(STAMP)
	$(PY) -m pytest tests/unit -q

test-server: $(STAMP)
	$(PY) -m pytest tests/server -q

lint: $(STAMP)
	$(PY) -m pyflakes webhook policies certs bench tests $(shell find hack -name '*.py' -not -path 'hack/cluster/run/*' -not -path 'hack/cluster/bin/*')

bench: $(STAMP)
	$(PY) bench/engine.py
	$(PY) bench/server.py

# The pause, OpenMPI runtime and service images from Debian packages (mmdebstrap, root): OCI archives in
# hack/images/out/ (or $TRAINJOB_IMAGES_OUT), tagged by a hash of their inputs; a rebuild prints 'cached'.
images: $(STAMP)
	$(PY) hack/images/images.py build

# examples/ is the source of the sample files the wheel ships as package data (webhook/samples):
# the demo, `policy lint` and the --help examples use them. tests/unit/test_examples.py fails until
# the copies are equal.
SAMPLES := cluster-state.yaml jobs runtimes bundles
samples:
	rm -rf webhook/samples && mkdir webhook/samples
	cd examples && cp -R $(SAMPLES) ../webhook/samples/

clean:
	rm -rf $(VENV) .pytest_cache .hypothesis

# The real control plane (etcd, kube-apiserver, controllers, KWOK, JobSet, Trainer) for the
# cluster tier: targets cluster-build, cluster-up, cluster-down, test-cluster.
include hack/cluster/cluster.mk
