"""policies/k8s."""
