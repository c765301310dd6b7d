"""TLS credentials for a migration over TLS, made with the `openssl` CLI:
a private CA and a destination ("server") and source ("client")
certificate signed by it, under the names both hakoniwa's `tls=DIR` and
QEMU's `tls-creds-x509,dir=DIR` read (docs/migration.md, "Security").

Keys are EC P-256 in unencrypted PKCS#8 ("BEGIN PRIVATE KEY", what
OpenSSL 3 writes), which rustls and QEMU's GnuTLS both accept. The
certificates carry what both check: the CA basicConstraints CA:TRUE and
keyCertSign; the end entities CA:FALSE, digitalSignature and
keyEncipherment, the serverAuth / clientAuth purpose, and the address
the source dials as an IP subjectAltName (the server's; GnuTLS and
rustls check no name in a client's, the client gets it anyway).

keyEncipherment means nothing for an EC key (no RSA key exchange), but
QEMU (crypto/tlscredsx509.c) refuses a certificate whose critical key
usage lacks it: "Certificate .../server-cert.pem usage does not permit
key encipherment", at `-object tls-creds-x509`, before any handshake.
rustls ignores the key usage.

dh-params.pem (RFC 7919's ffdhe2048, a named group: no prime search) is
for QEMU's server endpoint only: without it, QEMU 10.0 generates 2048-bit
DH parameters (gnutls_dh_params_generate2, crypto/tlscreds.c) each time
it creates the object, before its QMP socket is up: 0.2-0.9 s natively
on this machine (0.04 s with the file), and in the rig, while the source
guest dirtied memory, TLS destinations had no QMP socket after 60 s. TLS
1.3 with ECDHE never uses them; hakoniwa does not read the file."""

import os
import secrets
import subprocess

FILES = ("ca-cert.pem", "server-cert.pem", "server-key.pem", "client-cert.pem",
         "client-key.pem", "dh-params.pem")

# OpenSSL's config for the three certificates: only what is asked for,
# nothing from the system's openssl.cnf.
CONFIG = """[req]
distinguished_name = dn
prompt = no
[dn]
CN = unused
[ca]
basicConstraints = critical,CA:TRUE
keyUsage = critical,keyCertSign,cRLSign
subjectKeyIdentifier = hash
[server]
basicConstraints = critical,CA:FALSE
keyUsage = critical,digitalSignature,keyEncipherment
extendedKeyUsage = serverAuth
subjectAltName = IP:%(ip)s
subjectKeyIdentifier = hash
authorityKeyIdentifier = keyid
[client]
basicConstraints = critical,CA:FALSE
keyUsage = critical,digitalSignature,keyEncipherment
extendedKeyUsage = clientAuth
subjectAltName = IP:%(ip)s
subjectKeyIdentifier = hash
authorityKeyIdentifier = keyid
"""

KEY = ["-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:P-256", "-nodes"]


def _openssl(openssl, *argv, cwd):
    r = subprocess.run([openssl, *argv], cwd=cwd, capture_output=True, text=True)
    if r.returncode != 0:
        raise RuntimeError("openssl %s: status %d: %s" % (argv[0], r.returncode,
                                                          (r.stderr or r.stdout).strip()))
    return r.stdout


def make_credentials(directory, ip="127.0.0.1", days=2, openssl="openssl"):
    """Writes ca-cert.pem, server-cert.pem + server-key.pem,
    client-cert.pem + client-key.pem and dh-params.pem (for QEMU) into
    DIRECTORY (made if missing),
    valid DAYS days from now, the server's certificate for IP; the CA's
    key and the requests are removed. Returns DIRECTORY. Raises
    RuntimeError with openssl's words when a step fails."""
    os.makedirs(directory, exist_ok=True)
    cnf = os.path.join(directory, "openssl.cnf")
    with open(cnf, "w") as f:
        f.write(CONFIG % {"ip": ip})
    tmp = ["ca-key.pem", "server.csr", "client.csr", "openssl.cnf"]
    try:
        _openssl(openssl, "req", "-x509", *KEY, "-days", str(days), "-config", cnf,
                 "-extensions", "ca", "-subj", "/CN=hakoniwa bench migration CA",
                 "-keyout", "ca-key.pem", "-out", "ca-cert.pem", cwd=directory)
        for role in ("server", "client"):
            _openssl(openssl, "req", "-new", *KEY, "-config", cnf,
                     "-subj", "/CN=hakoniwa bench %s" % role,
                     "-keyout", "%s-key.pem" % role, "-out", "%s.csr" % role, cwd=directory)
            _openssl(openssl, "x509", "-req", "-in", "%s.csr" % role, "-CA", "ca-cert.pem",
                     "-CAkey", "ca-key.pem", "-set_serial", str(secrets.randbits(63) + 1),
                     "-days", str(days), "-sha256", "-extfile", cnf, "-extensions", role,
                     "-out", "%s-cert.pem" % role, cwd=directory)
            os.chmod(os.path.join(directory, "%s-key.pem" % role), 0o600)
        _openssl(openssl, "genpkey", "-genparam", "-algorithm", "DH", "-pkeyopt",
                 "group:ffdhe2048", "-out", "dh-params.pem", cwd=directory)
    finally:
        for name in tmp:
            try:
                os.unlink(os.path.join(directory, name))
            except FileNotFoundError:
                pass
    return directory


def check_credentials(directory, ip="127.0.0.1", openssl="openssl"):
    """openssl's own verdict on DIRECTORY: each certificate chains to
    ca-cert.pem for its purpose (server: TLS server for IP; client: TLS
    client) and each key matches its certificate. Raises RuntimeError
    naming what fails."""
    for name in FILES:
        if not os.path.isfile(os.path.join(directory, name)):
            raise RuntimeError("%s: no %s" % (directory, name))
    _openssl(openssl, "verify", "-CAfile", "ca-cert.pem", "-purpose", "sslserver",
             "-verify_ip", ip, "server-cert.pem", cwd=directory)
    _openssl(openssl, "verify", "-CAfile", "ca-cert.pem", "-purpose", "sslclient",
             "client-cert.pem", cwd=directory)
    _openssl(openssl, "pkeyparam", "-noout", "-in", "dh-params.pem", cwd=directory)
    for role in ("server", "client"):
        a = _openssl(openssl, "x509", "-noout", "-pubkey", "-in", "%s-cert.pem" % role,
                     cwd=directory)
        b = _openssl(openssl, "pkey", "-pubout", "-in", "%s-key.pem" % role, cwd=directory)
        if a != b:
            raise RuntimeError("%s: %s-key.pem is not %s-cert.pem's key" % (directory, role,
                                                                          role))


def describe(directory, openssl="openssl"):
    """What the results record about the credentials: the key's kind and
    encoding and openssl's version."""
    with open(os.path.join(directory, "server-key.pem")) as f:
        head = f.readline().strip()
    return {"key": "EC P-256, %s" % {"-----BEGIN PRIVATE KEY-----": "PKCS#8",
                                     "-----BEGIN EC PRIVATE KEY-----": "SEC1"}.get(head, head),
            "signature": "ecdsa-with-SHA256", "openssl": _openssl(openssl, "version",
                                                                   cwd=directory).strip()}
