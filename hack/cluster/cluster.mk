# Placeholder until the control-plane tier lands: it is owned by hack/cluster.
.PHONY: cluster-build cluster-up cluster-down
test-cluster:
	@echo "cluster tier: not built yet"
