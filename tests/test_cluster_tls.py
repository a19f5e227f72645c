"""The cluster's credentials: a kept CA, a certificate per node, strict X.509 validation.

Python 3.13 verifies with ``VERIFY_X509_STRICT`` by default: a certificate without key usage or
authority key identifier is refused ("Missing Authority Key Identifier"). The handshakes here run
that strict check on any Python (and under a Python 3.13 where this machine has one)."""
import datetime
import os
import shutil
import socket
import ssl
import stat
import subprocess
import threading

import pytest

from tvm_ext.cli.main import main
from tvm_ext.cluster import tls


def _context(server: bool, ca: str, cert: str | None, key: str | None) -> ssl.SSLContext:
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER if server else ssl.PROTOCOL_TLS_CLIENT)
    ctx.verify_mode = ssl.CERT_REQUIRED
    ctx.check_hostname = False
    ctx.verify_flags |= ssl.VERIFY_X509_STRICT
    ctx.load_verify_locations(ca)
    if cert:
        ctx.load_cert_chain(cert, key)
    return ctx


def handshake(server_files, client_files):
    """Mutual TLS over a loopback socket pair, strict X.509 on both ends; returns (the client's
    view of the server's CN, the server's error or None)."""
    a, b = socket.socketpair()
    errors = {}

    def serve():
        try:
            with _context(True, *server_files).wrap_socket(a, server_side=True) as s:
                s.recv(1)
        except (ssl.SSLError, OSError) as err:
            errors["server"] = err

    thread = threading.Thread(target=serve)
    thread.start()
    try:
        with _context(False, *client_files).wrap_socket(b) as c:
            c.sendall(b"x")
            subject = dict(x[0] for x in c.getpeercert()["subject"])
    finally:
        thread.join(10)
    return subject["commonName"], errors.get("server")


def test_node_certificates_pass_a_strict_handshake(tmp_path):
    creds = tls.make_credentials(str(tmp_path / "c"))
    node = tls.issue(creds, "gpu-a")
    cn, server_error = handshake(tls.paths(creds, "scheduler"), tls.paths(node))
    assert (cn, server_error) == ("scheduler", None)
    cn, server_error = handshake(tls.paths(node), tls.paths(creds, "client"))  # a worker's server side too
    assert (cn, server_error) == ("gpu-a", None)


def test_a_certificate_without_the_extensions_fails_the_same_strict_handshake(tmp_path):
    """What the old credentials were (CA and leaf without key usage or key identifiers): the
    check above is the one that refuses them."""
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import NameOID

    now = datetime.datetime.now(datetime.timezone.utc)
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "old CA")])
    key = ec.generate_private_key(ec.SECP256R1())
    ca = (x509.CertificateBuilder().subject_name(name).issuer_name(name).public_key(key.public_key())
          .serial_number(1).not_valid_before(now - datetime.timedelta(hours=1))
          .not_valid_after(now + datetime.timedelta(days=1))
          .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True).sign(key, hashes.SHA256()))
    leaf = (x509.CertificateBuilder().subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "old")]))
            .issuer_name(name).public_key(key.public_key()).serial_number(2)
            .not_valid_before(now - datetime.timedelta(hours=1)).not_valid_after(now + datetime.timedelta(days=1))
            .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
            .sign(key, hashes.SHA256()))
    pem = serialization.Encoding.PEM
    (tmp_path / "ca.pem").write_bytes(ca.public_bytes(pem))
    (tmp_path / "cert.pem").write_bytes(leaf.public_bytes(pem))
    (tmp_path / "key.pem").write_bytes(key.private_bytes(pem, serialization.PrivateFormat.PKCS8,
                                                         serialization.NoEncryption()))
    old = tuple(str(tmp_path / n) for n in ("ca.pem", "cert.pem", "key.pem"))
    with pytest.raises(ssl.SSLCertVerificationError):
        handshake(old, old)


STRICT_DEFAULT = """
import socket, ssl, sys, threading
ca, scert, skey, ccert, ckey = sys.argv[1:]
assert ssl.create_default_context().verify_flags & ssl.VERIFY_X509_STRICT, "not a strict-default Python"
server = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH, cafile=ca)
server.verify_mode = ssl.CERT_REQUIRED
server.load_cert_chain(scert, skey)
client = ssl.create_default_context(ssl.Purpose.SERVER_AUTH, cafile=ca)
client.check_hostname = False
client.load_cert_chain(ccert, ckey)
a, b = socket.socketpair()
t = threading.Thread(target=lambda: server.wrap_socket(a, server_side=True).recv(1))
t.start()
c = client.wrap_socket(b)
c.sendall(b"x")
t.join()
print(dict(x[0] for x in c.getpeercert()["subject"])["commonName"])
"""


def _python313():
    """A Python 3.13 that runs here (a pyenv shim of a version not selected does not)."""
    import glob

    for exe in [*sorted(glob.glob(os.path.expanduser("~/.pyenv/versions/3.13*/bin/python3.13"))),
                shutil.which("python3.13")]:
        if exe and subprocess.run([exe, "-c", "pass"], capture_output=True).returncode == 0:
            return exe
    return None


@pytest.mark.skipif(_python313() is None, reason="no Python 3.13 on this machine (the strict handshake above runs "
                                                "the same check on this Python)")
def test_python_3_13_default_contexts_accept_the_credentials(tmp_path):
    creds = tls.make_credentials(str(tmp_path / "c"))
    ca, scert, skey = tls.paths(creds, "scheduler")
    _, ccert, ckey = tls.paths(tls.issue(creds, "node1"))
    out = subprocess.run([_python313(), "-c", STRICT_DEFAULT, ca, scert, skey, ccert, ckey],
                         capture_output=True, text=True, timeout=60)
    assert out.returncode == 0 and out.stdout.strip() == "scheduler", out.stderr[-500:]


def test_the_ca_key_and_node_keys_are_private_and_the_ca_is_never_replaced(tmp_path):
    creds = tls.make_credentials(str(tmp_path / "c"))
    node = tls.issue(creds, "node7")
    for path in (os.path.join(creds, tls.CA_KEY), os.path.join(node, tls.KEY),
                 os.path.join(creds, "client", tls.KEY)):
        assert stat.S_IMODE(os.stat(path).st_mode) == 0o600
    assert sorted(os.listdir(node)) == ["ca.pem", "cert.pem", "key.pem"]  # no CA key travels to a node
    with pytest.raises(ValueError, match="already holds a cluster CA"):
        tls.make_credentials(creds)


@pytest.mark.parametrize("argv, message", [
    (["cluster", "credentials", "{d}", "--node", "bad/name"], "node name 'bad/name'"),
    (["cluster", "credentials", "{d}/none", "--node", "n1"], "no cluster CA to sign with"),
])
def test_bad_credentials_requests_are_one_line(argv, message, tmp_path, capsys):
    tls.make_credentials(str(tmp_path / "c"))
    assert main([a.format(d=tmp_path / "c") for a in argv]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and message in err


def test_the_command_issues_a_node_folder_signed_by_the_kept_ca(tmp_path, capsys):
    d = str(tmp_path / "c")
    assert main(["cluster", "credentials", d]) == 0
    assert main(["cluster", "credentials", d, "--node", "gpu-b"]) == 0
    assert "copy the folder" in capsys.readouterr().err
    cn, err = handshake(tls.paths(d, "scheduler"), tls.paths(os.path.join(d, "gpu-b")))
    assert (cn, err) == ("scheduler", None)
