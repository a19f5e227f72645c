"""TLS credentials of a tuning cluster: one CA and one certificate that every node presents.

A cluster runs whatever code reaches it, so tvm_ext's clusters use mutual TLS: the scheduler,
every worker and the client present a certificate signed by the cluster's CA, and Dask refuses a
connection without one (a node without the credentials cannot join, a client cannot submit). The
certificate is a shared secret, like a token: keep the directory private (the key is mode 0600)
and copy it to the nodes over a channel you trust.
"""
from __future__ import annotations

import datetime
import os

CA, CERT, KEY = "ca.pem", "node.pem", "node-key.pem"


def make_credentials(directory: str, days: int = 30) -> str:
    """Write ``ca.pem``, ``node.pem`` and ``node-key.pem`` into ``directory``; returns it."""
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import NameOID

    now = datetime.datetime.now(datetime.timezone.utc)
    valid = {"not_valid_before": now - datetime.timedelta(minutes=5),
             "not_valid_after": now + datetime.timedelta(days=days)}

    def name(text):
        return x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, text)])

    ca_key, node_key = ec.generate_private_key(ec.SECP256R1()), ec.generate_private_key(ec.SECP256R1())
    ca = (x509.CertificateBuilder().subject_name(name("tvm_ext cluster CA")).issuer_name(name("tvm_ext cluster CA"))
          .public_key(ca_key.public_key()).serial_number(x509.random_serial_number())
          .not_valid_before(valid["not_valid_before"]).not_valid_after(valid["not_valid_after"])
          .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
          .sign(ca_key, hashes.SHA256()))
    node = (x509.CertificateBuilder().subject_name(name("tvm_ext cluster node")).issuer_name(ca.subject)
            .public_key(node_key.public_key()).serial_number(x509.random_serial_number())
            .not_valid_before(valid["not_valid_before"]).not_valid_after(valid["not_valid_after"])
            .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
            .sign(ca_key, hashes.SHA256()))
    os.makedirs(directory, exist_ok=True)
    pem = serialization.Encoding.PEM
    with open(os.path.join(directory, CA), "wb") as f:
        f.write(ca.public_bytes(pem))
    with open(os.path.join(directory, CERT), "wb") as f:
        f.write(node.public_bytes(pem))
    key_path = os.path.join(directory, KEY)
    fd = os.open(key_path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "wb") as f:
        f.write(node_key.private_bytes(pem, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()))
    return directory


def paths(directory: str) -> tuple[str, str, str]:
    """(ca, cert, key) of ``directory``; ValueError in one line when one is missing."""
    found = tuple(os.path.join(directory, n) for n in (CA, CERT, KEY))
    missing = [p for p in found if not os.path.isfile(p)]
    if missing:
        raise ValueError(f"{directory}: no cluster credentials ({', '.join(map(os.path.basename, missing))} missing); "
                         "make them with 'tvm-ext cluster credentials DIR'")
    return found


def security(directory: str):
    """The ``distributed.Security`` a client (or in-process node) of the cluster uses."""
    from distributed import Security

    ca, cert, key = paths(directory)
    return Security(tls_ca_file=ca, tls_client_cert=cert, tls_client_key=key, tls_scheduler_cert=cert,
                    tls_scheduler_key=key, tls_worker_cert=cert, tls_worker_key=key, require_encryption=True)


def cli_flags(directory: str) -> list[str]:
    """The ``dask scheduler`` / ``dask worker`` flags that make a node present the credentials."""
    ca, cert, key = paths(directory)
    return ["--tls-ca-file", ca, "--tls-cert", cert, "--tls-key", key]


__all__ = ["cli_flags", "make_credentials", "paths", "security"]
