"""Tuning on a cluster: a workload's tasks spread over a Dask-distributed cluster.

``tls``     the cluster's credentials: one CA, one certificate every node shares (mutual TLS)
``local``   start and stop a scheduler and worker processes on this machine (tests, the scaling
            benchmark, trying it out), each worker pinned to its own cores
``tune``    the driver (``tune_on_cluster``) and what a worker runs (``tune_remote``)

Dask is an optional dependency (``pip install -e '.[cluster]'``); nothing here is imported by
``import tvm_ext``.
"""
