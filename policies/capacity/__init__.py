"""Room for a job: node fit, job fit, quota scopes and demand, object counts, Kueue's queues and
the reservations of jobs admitted but not yet running.

May import: policies.k8s, policies.cel, policies.job.
"""
