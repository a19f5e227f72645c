"""``tvm-ext cluster``: credentials for a tuning cluster, and a local one to try it on."""
from __future__ import annotations

from tvm_ext.cli.common import log

HOW = """A tuning cluster is Dask-distributed: one scheduler, any number of worker nodes, each with
tvm_ext installed (pip install -e '.[cluster]'), each presenting a certificate of the cluster's CA:

  C=~/.tvm_ext/cluster
  tvm-ext cluster credentials $C                 # once: the CA (its key stays here), scheduler/, client/
  tvm-ext cluster credentials $C --node gpu-a    # per node: copy only the folder $C/gpu-a to it
  f() { echo "--tls-ca-file $1/ca.pem --tls-cert $1/cert.pem --tls-key $1/key.pem"; }
  dask scheduler --protocol tls --host HEAD_IP --no-dashboard $(f $C/scheduler)         # head node
  dask worker tls://HEAD_IP:8786 --nthreads 1 --no-dashboard --name gpu-a $(f gpu-a)   # on node gpu-a
  tvm-ext tune resnet50-int8 --cluster tls://HEAD_IP:8786 --cluster-credentials $C

The driver asks every node its CPU, cores and GPU first and sends a task only to nodes that can run
the target (their CPU the target's unless --allow-mixed-cpus), one task per node at a time, timed on
the target's num-cores threads; what comes back is checked before it is committed.
Bind the scheduler to a private interface: a cluster runs whatever code reaches it."""


def add_parser(sub) -> None:
    p = sub.add_parser("cluster", help="TLS credentials for a tuning cluster, or a local cluster to try",
                       description=HOW, formatter_class=__import__("argparse").RawDescriptionHelpFormatter)
    verbs = p.add_subparsers(dest="verb", metavar="VERB")
    verbs.required = True
    c = verbs.add_parser("credentials", help="make the cluster's CA in DIR (with scheduler/ and client/), or with "
                                            "--node NAME a node's certificate signed by it")
    c.add_argument("dir", metavar="DIR")
    c.add_argument("--node", default=None, metavar="NAME",
                   help="issue DIR/NAME/ (ca.pem, cert.pem, key.pem) for one worker node, signed by DIR's CA")
    c.add_argument("--days", type=int, default=365, help="validity (default 365 days)")
    loc = verbs.add_parser("local", help="run a scheduler and N worker nodes on this machine until Ctrl-C")
    loc.add_argument("--workers", type=int, default=2, help="worker nodes, each pinned to one core (default 2)")
    loc.add_argument("--credentials", default=None, metavar="DIR",
                     help="use these credentials (default: new ones in a temporary folder, printed)")
    p.set_defaults(func=run)


def connect(address: str, credentials: str | None):
    """A ``distributed.Client`` of the cluster at ``address``; ValueError / OSError in one line
    when Dask is missing, the address is not TLS, the credentials are missing or it cannot be reached."""
    import importlib.util
    import os

    if importlib.util.find_spec("distributed") is None:
        raise ValueError("--cluster needs Dask: pip install -e '.[cluster]'")
    if not address.startswith("tls://"):
        raise ValueError(f"--cluster {address}: use a tls:// address; tvm_ext talks to clusters with TLS only "
                         "(a cluster runs whatever code reaches it)")
    if not credentials:
        raise ValueError("--cluster needs --cluster-credentials DIR (the cluster's TLS credentials; "
                         "'tvm-ext cluster credentials DIR' makes them)")
    from distributed import Client

    from tvm_ext.cluster.tls import security

    sec = security(credentials)
    try:
        return Client(address, security=sec, timeout=float(os.environ.get("TVM_EXT_CLUSTER_CONNECT_S", "15")))
    except (OSError, TimeoutError) as err:
        raise OSError(f"cannot reach the cluster at {address}: {str(err).splitlines()[0] if str(err) else err}") \
            from None


def run(args) -> int:
    import time

    from tvm_ext.cluster.tls import issue, make_credentials

    if args.verb == "credentials":
        if args.days < 1:
            raise ValueError(f"--days must be at least 1, not {args.days}")
        if args.node:
            folder = issue(args.dir, args.node, days=args.days)
            log(f"wrote {folder}/ (ca.pem, cert.pem, key.pem mode 0600): copy the folder to node {args.node}")
        else:
            make_credentials(args.dir, days=args.days)
            log(f"wrote the CA in {args.dir} (ca-key.pem, mode 0600, stays here), {args.dir}/scheduler/ and "
                f"{args.dir}/client/; add each worker with --node NAME and copy the folder to it")
        return 0
    if args.workers < 1:
        raise ValueError(f"--workers must be at least 1, not {args.workers}")
    from tvm_ext.cluster.local import LocalCluster

    with LocalCluster(workers=args.workers, tls_dir=args.credentials, log=log) as cluster:
        print(f"tvm-ext tune WORKLOAD --cluster {cluster.address} --cluster-credentials {cluster.tls_dir}",
              flush=True)
        try:
            while True:
                time.sleep(3600)
        except KeyboardInterrupt:
            log("stopping the local cluster")
    return 0
