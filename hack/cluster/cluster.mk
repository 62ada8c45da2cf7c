# The cluster test tier: a real control plane (etcd, kube-apiserver, kube-controller-manager,
# kube-scheduler, KWOK, JobSet, Trainer, Kueue) built from Go modules and run on 127.0.0.1, in two
# stacks: the newest and the oldest this machine builds (TJA_STACK=oldest for up/down/status).
# Driven by hack/cluster/cluster.py; versions are pinned in its VERSIONS and OLDEST dicts.
CLUSTER := $(PY) hack/cluster/cluster.py

.PHONY: cluster-build cluster-up cluster-down cluster-status test-cluster

cluster-build: $(STAMP)
	$(CLUSTER) build --stack all

cluster-up: $(STAMP)
	$(CLUSTER) up

cluster-down: $(STAMP)
	$(CLUSTER) down

cluster-status: $(STAMP)
	$(CLUSTER) status

# both stacks: build (cached; the oldest beside the newest's tests) + up + pytest + down; skipped
# (exit 0) without Go.
test-cluster: $(STAMP)
	$(CLUSTER) test
