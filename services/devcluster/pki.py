"""Certificates and keys for a throwaway local control plane.

One CA signs the apiserver's serving certificate and one client certificate per identity;
the apiserver trusts that CA for client-certificate authentication, so the identity
(CN = user, O = groups) is what RBAC and the Node authorizer see. Elliptic-curve keys keep
generation fast; nothing here is meant to outlive the cluster.
"""

from __future__ import annotations

import datetime
import ipaddress
from dataclasses import dataclass
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec, rsa
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

# Long enough for a `dev cluster up` left running for weeks; the cluster is disposable.
_VALIDITY = datetime.timedelta(days=365)
# Tolerate small clock differences between signing and first use.
_BACKDATE = datetime.timedelta(minutes=5)


@dataclass(frozen=True)
class CertPair:
    cert_pem: bytes
    key_pem: bytes

    def write(self, directory: Path, stem: str) -> tuple[Path, Path]:
        cert_path = directory / f"{stem}.crt"
        key_path = directory / f"{stem}.key"
        cert_path.write_bytes(self.cert_pem)
        key_path.touch(mode=0o600)
        key_path.write_bytes(self.key_pem)
        return cert_path, key_path


def _new_key() -> ec.EllipticCurvePrivateKey:
    return ec.generate_private_key(ec.SECP256R1())


CaKey = ec.EllipticCurvePrivateKey | rsa.RSAPrivateKey


def _key_pem(key: CaKey) -> bytes:
    # RSA keys as PKCS#1 ("RSA PRIVATE KEY"): the only form some cert rotators parse.
    key_format = (
        serialization.PrivateFormat.TraditionalOpenSSL
        if isinstance(key, rsa.RSAPrivateKey)
        else serialization.PrivateFormat.PKCS8
    )
    return key.private_bytes(serialization.Encoding.PEM, key_format, serialization.NoEncryption())


def _name(common_name: str, organizations: tuple[str, ...] = ()) -> x509.Name:
    attributes = [x509.NameAttribute(NameOID.ORGANIZATION_NAME, org) for org in organizations]
    attributes.append(x509.NameAttribute(NameOID.COMMON_NAME, common_name))
    return x509.Name(attributes)


class CertificateAuthority:
    def __init__(
        self,
        common_name: str = "tideshift-devcluster-ca",
        *,
        dns_names: tuple[str, ...] = (),
        rsa_key: bool = False,
    ) -> None:
        """A fresh self-signed CA. `dns_names` and `rsa_key` are for the engines' certificate
        rotators (open-policy-agent/cert-controller), which check that their CA is valid for
        its own name and parse only a PKCS#1 RSA CA key."""
        self._key: CaKey = (
            rsa.generate_private_key(public_exponent=65537, key_size=2048)
            if rsa_key
            else _new_key()
        )
        now = datetime.datetime.now(datetime.UTC)
        subject = _name(common_name)
        builder = (
            x509.CertificateBuilder()
            .subject_name(subject)
            .issuer_name(subject)
            .public_key(self._key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(now - _BACKDATE)
            .not_valid_after(now + _VALIDITY)
            .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
            .add_extension(
                x509.KeyUsage(
                    digital_signature=True,
                    content_commitment=False,
                    key_encipherment=False,
                    data_encipherment=False,
                    key_agreement=False,
                    key_cert_sign=True,
                    crl_sign=True,
                    encipher_only=False,
                    decipher_only=False,
                ),
                critical=True,
            )
            .add_extension(
                x509.SubjectKeyIdentifier.from_public_key(self._key.public_key()), critical=False
            )
        )
        if dns_names:
            names: list[x509.GeneralName] = [x509.DNSName(name) for name in dns_names]
            builder = builder.add_extension(x509.SubjectAlternativeName(names), critical=False)
        self._cert = builder.sign(self._key, hashes.SHA256())

    @classmethod
    def load(cls, cert_pem: bytes, key_pem: bytes) -> CertificateAuthority:
        """The CA written by `pair.write`, to issue more certificates later."""
        key = serialization.load_pem_private_key(key_pem, password=None)
        if not isinstance(key, ec.EllipticCurvePrivateKey | rsa.RSAPrivateKey):
            raise ValueError("expected an elliptic-curve or RSA key, as this module writes")
        ca = cls.__new__(cls)
        ca._key = key
        ca._cert = x509.load_pem_x509_certificate(cert_pem)
        return ca

    @property
    def pair(self) -> CertPair:
        return CertPair(self._cert.public_bytes(serialization.Encoding.PEM), _key_pem(self._key))

    def _issue(
        self,
        subject: x509.Name,
        *,
        usages: list[x509.ObjectIdentifier],
        sans: list[x509.GeneralName] | None = None,
    ) -> CertPair:
        key = _new_key()
        now = datetime.datetime.now(datetime.UTC)
        builder = (
            x509.CertificateBuilder()
            .subject_name(subject)
            .issuer_name(self._cert.subject)
            .public_key(key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(now - _BACKDATE)
            .not_valid_after(now + _VALIDITY)
            .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
            .add_extension(
                x509.KeyUsage(
                    digital_signature=True,
                    content_commitment=False,
                    key_encipherment=False,
                    data_encipherment=False,
                    key_agreement=False,
                    key_cert_sign=False,
                    crl_sign=False,
                    encipher_only=False,
                    decipher_only=False,
                ),
                critical=True,
            )
            .add_extension(x509.ExtendedKeyUsage(usages), critical=False)
            .add_extension(
                x509.AuthorityKeyIdentifier.from_issuer_public_key(self._key.public_key()),
                critical=False,
            )
        )
        if sans:
            builder = builder.add_extension(x509.SubjectAlternativeName(sans), critical=False)
        cert = builder.sign(self._key, hashes.SHA256())
        return CertPair(cert.public_bytes(serialization.Encoding.PEM), _key_pem(key))

    def issue_server(self, common_name: str, *, dns_names: list[str], ips: list[str]) -> CertPair:
        sans: list[x509.GeneralName] = [x509.DNSName(name) for name in dns_names]
        sans += [x509.IPAddress(ipaddress.ip_address(ip)) for ip in ips]
        return self._issue(_name(common_name), usages=[ExtendedKeyUsageOID.SERVER_AUTH], sans=sans)

    def issue_client(self, user: str, groups: tuple[str, ...] = ()) -> CertPair:
        return self._issue(_name(user, groups), usages=[ExtendedKeyUsageOID.CLIENT_AUTH])


def service_account_signing_key() -> tuple[bytes, bytes]:
    """(private PEM, public PEM) for signing and verifying ServiceAccount tokens (ES256)."""
    key = _new_key()
    public_pem = key.public_key().public_bytes(
        serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo
    )
    return _key_pem(key), public_pem
