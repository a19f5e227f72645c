"""TLS credentials of a tuning cluster: a CA kept on the issuing machine, a certificate per node.

A cluster runs whatever code reaches it, so tvm_ext's clusters use mutual TLS: the scheduler, every
worker and the client present a certificate signed by the cluster's CA, and refuse a peer without one.

Layout of a credentials directory ``DIR`` (``tvm-ext cluster credentials DIR [--node NAME]``)::

    DIR/ca.pem  DIR/ca-key.pem (0600)      the CA; its key never leaves this machine
    DIR/<name>/ca.pem cert.pem key.pem     one folder per node or role, the only thing copied to it

``scheduler`` and ``client`` are made with the CA; ``--node NAME`` adds a worker's folder later,
signed by the kept CA. Every certificate carries what strict X.509 validation asks for (Python
3.13 turns ``VERIFY_X509_STRICT`` on by default): key usage, extended key usage, subject and
authority key identifiers, a subject alternative name; the CA is marked critical ``CA:TRUE``.
"""
from __future__ import annotations

import datetime
import os
import re

CA, CA_KEY = "ca.pem", "ca-key.pem"
CERT, KEY = "cert.pem", "key.pem"
ROLES = ("scheduler", "client")
_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,62}$")


def _write(path: str, data: bytes, private: bool = False) -> None:
    fd = os.open(path + ".tmp", os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600 if private else 0o644)
    with os.fdopen(fd, "wb") as f:
        f.write(data)
    os.replace(path + ".tmp", path)


def _pem_key(key) -> bytes:
    from cryptography.hazmat.primitives import serialization

    return key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                             serialization.NoEncryption())


def _builder(subject: str, issuer, public_key, not_before, not_after):
    from cryptography import x509
    from cryptography.x509.oid import NameOID

    name = x509.Name([x509.NameAttribute(NameOID.ORGANIZATION_NAME, "tvm_ext cluster"),
                      x509.NameAttribute(NameOID.COMMON_NAME, subject)])
    return (x509.CertificateBuilder().subject_name(name).issuer_name(issuer or name).public_key(public_key)
            .serial_number(x509.random_serial_number()).not_valid_before(not_before).not_valid_after(not_after)
            .add_extension(x509.SubjectKeyIdentifier.from_public_key(public_key), critical=False))


def _validity(days: float, not_before=None):
    start = not_before or datetime.datetime.now(datetime.timezone.utc) - datetime.timedelta(minutes=5)
    return start, start + datetime.timedelta(days=days)


def make_credentials(directory: str, days: int = 365) -> str:
    """Write a new CA (``ca.pem``, ``ca-key.pem`` mode 0600) and the ``scheduler`` and ``client``
    folders into ``directory``; returns it. Refuses (ValueError) to replace a CA that is there:
    every certificate it signed would stop working."""
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes
    from cryptography.hazmat.primitives.asymmetric import ec

    if os.path.exists(os.path.join(directory, CA_KEY)):
        raise ValueError(f"{directory} already holds a cluster CA; add a node with "
                         f"'tvm-ext cluster credentials {directory} --node NAME' (or choose a new folder)")
    os.makedirs(directory, exist_ok=True)
    key = ec.generate_private_key(ec.SECP256R1())
    start, end = _validity(days)
    ca = (_builder("tvm_ext cluster CA", None, key.public_key(), start, end)
          .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
          .add_extension(x509.KeyUsage(digital_signature=False, content_commitment=False, key_encipherment=False,
                                       data_encipherment=False, key_agreement=False, key_cert_sign=True,
                                       crl_sign=True, encipher_only=False, decipher_only=False), critical=True)
          .add_extension(x509.AuthorityKeyIdentifier.from_issuer_public_key(key.public_key()), critical=False)
          .sign(key, hashes.SHA256()))
    from cryptography.hazmat.primitives import serialization

    _write(os.path.join(directory, CA_KEY), _pem_key(key), private=True)
    _write(os.path.join(directory, CA), ca.public_bytes(serialization.Encoding.PEM))
    for role in ROLES:
        issue(directory, role, days=days)
    return directory


def issue(directory: str, name: str, days: float = 365, not_before=None) -> str:
    """Sign a certificate for node (or role) ``name`` with the CA kept in ``directory``; writes
    ``directory/name/{ca,cert,key}.pem`` (key 0600) and returns that folder. ``not_before``: the
    start of its validity (default now); a test makes an expired one with a past start."""
    import ipaddress

    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import ExtendedKeyUsageOID

    if not _NAME.match(name or "") or name in ("ca", "ca-key"):
        raise ValueError(f"node name {name!r}: use letters, digits, '.', '_' or '-' (at most 63)")
    ca_key_path, ca_path = os.path.join(directory, CA_KEY), os.path.join(directory, CA)
    if not os.path.isfile(ca_key_path) or not os.path.isfile(ca_path):
        raise ValueError(f"{directory}: no cluster CA to sign with (make one with 'tvm-ext cluster credentials "
                         f"{directory}')")
    with open(ca_key_path, "rb") as f:
        ca_key = serialization.load_pem_private_key(f.read(), password=None)
    with open(ca_path, "rb") as f:
        ca_pem = f.read()
    ca = x509.load_pem_x509_certificate(ca_pem)
    key = ec.generate_private_key(ec.SECP256R1())
    start, end = _validity(days, not_before)
    usage = ([ExtendedKeyUsageOID.CLIENT_AUTH] if name == "client"
             else [ExtendedKeyUsageOID.SERVER_AUTH, ExtendedKeyUsageOID.CLIENT_AUTH])  # nodes both listen and dial
    cert = (_builder(name, ca.subject, key.public_key(), start, end)
            .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
            .add_extension(x509.KeyUsage(digital_signature=True, content_commitment=False, key_encipherment=False,
                                         data_encipherment=False, key_agreement=True, key_cert_sign=False,
                                         crl_sign=False, encipher_only=False, decipher_only=False), critical=True)
            .add_extension(x509.ExtendedKeyUsage(usage), critical=False)
            .add_extension(x509.AuthorityKeyIdentifier.from_issuer_public_key(ca_key.public_key()), critical=False)
            .add_extension(x509.SubjectAlternativeName([x509.DNSName(name), x509.DNSName("localhost"),
                                                        x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]),
                           critical=False)
            .sign(ca_key, hashes.SHA256()))
    folder = os.path.join(directory, name)
    os.makedirs(folder, exist_ok=True)
    _write(os.path.join(folder, KEY), _pem_key(key), private=True)
    _write(os.path.join(folder, CERT), cert.public_bytes(serialization.Encoding.PEM))
    _write(os.path.join(folder, CA), ca_pem)
    return folder


def paths(folder: str, role: str = "client") -> tuple[str, str, str]:
    """(ca, cert, key) a process presents: ``folder`` is one node's folder, or a credentials
    directory (then its ``role`` folder); ValueError in one line when something is missing."""
    if os.path.isfile(os.path.join(folder, CA_KEY)) and not os.path.isfile(os.path.join(folder, CERT)):
        folder = os.path.join(folder, role)
    found = tuple(os.path.join(folder, n) for n in (CA, CERT, KEY))
    missing = [p for p in found if not os.path.isfile(p)]
    if missing:
        old = os.path.isfile(os.path.join(os.path.dirname(folder.rstrip("/")), "node.pem"))
        raise ValueError(f"{folder}: no cluster credentials ({', '.join(map(os.path.basename, missing))} missing); "
                         + ("these were made by an older tvm_ext (one shared certificate): make new ones with "
                            if old else "make them with ") + "'tvm-ext cluster credentials DIR'")
    return found


def security(folder: str, role: str = "client"):
    """The ``distributed.Security`` a process of the cluster uses (default: the client's)."""
    from distributed import Security

    ca, cert, key = paths(folder, role)
    return Security(tls_ca_file=ca, tls_client_cert=cert, tls_client_key=key, tls_scheduler_cert=cert,
                    tls_scheduler_key=key, tls_worker_cert=cert, tls_worker_key=key, require_encryption=True)


def cli_flags(folder: str, role: str = "scheduler") -> list[str]:
    """The ``dask scheduler`` / ``dask worker`` flags that make a node present its certificate."""
    ca, cert, key = paths(folder, role)
    return ["--tls-ca-file", ca, "--tls-cert", cert, "--tls-key", key]


__all__ = ["cli_flags", "issue", "make_credentials", "paths", "security"]
