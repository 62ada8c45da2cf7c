"""The effective job: a TrainJob (or v2beta1 MPIJob) merged with its runtime as Trainer builds
it (runtimePatches, strategic merge, phases, the runtime snapshot, queueing labels).

May import: policies.k8s, policies.cel.
"""
