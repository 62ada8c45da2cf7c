# The cluster test tier: a real control plane (etcd, kube-apiserver, kube-controller-manager,
# kube-scheduler, KWOK, JobSet, Trainer, Kueue) built from Go modules and run on 127.0.0.1.
# Driven by hack/cluster/cluster.py; versions are pinned in its VERSIONS dict.
CLUSTER := $(PY) hack/cluster/cluster.py

.PHONY: cluster-build cluster-up cluster-down cluster-status test-cluster

cluster-build: $(STAMP)
	$(CLUSTER) build

cluster-up: $(STAMP)
	$(CLUSTER) up

cluster-down: $(STAMP)
	$(CLUSTER) down

cluster-status: $(STAMP)
	$(CLUSTER) status

# build (cached) + up + pytest tests/cluster -m cluster + down; skipped (exit 0) without Go.
test-cluster: $(STAMP)
	$(CLUSTER) test
