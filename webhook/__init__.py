"""Admission webhook for Kubeflow Trainer TrainJobs: HTTPS server, decisions, injections."""
