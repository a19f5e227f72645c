"""Tuning on a cluster: a workload's tasks spread over a Dask-distributed cluster.

``tls``       the cluster's credentials: a CA kept where they are issued, a certificate per node (mutual TLS)
``local``     start and stop a scheduler and worker processes on this machine (tests, the scaling
              benchmark, trying it out), each worker pinned to its own cores
``nodes``     what each node is (CPU, cores, GPU) and which may tune a target
``checks``    what a node sends back, checked before it is committed
``dispatch``  which node tunes which task: one at a time per node, deadlines, runs again elsewhere
``tune``      the driver (``tune_on_cluster``) and what a worker runs (``tune_remote``)

Dask is an optional dependency (``pip install -e '.[cluster]'``); nothing here is imported by
``import tvm_ext``.
"""
