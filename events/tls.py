"""TLS to NATS for every Tideshift client, from one place: the environment.

The services' bus (`services.common.bus.connect`) and the users' `EventClient` both read
these variables, which the chart sets from its values, so a reaction pod and a service pod
are configured alike. Here rather than in the bus because the events package imports no
service code.
"""

from __future__ import annotations

import os
import ssl

# The CA bundle that signed the server's certificate (PEM); unset = the system's CAs.
TLS_CA_VARIABLE = "TIDESHIFT_NATS_TLS_CA_FILE"
# A client certificate and its key (PEM), for a server that verifies clients (mutual TLS).
TLS_CERT_VARIABLE = "TIDESHIFT_NATS_TLS_CERT_FILE"
TLS_KEY_VARIABLE = "TIDESHIFT_NATS_TLS_KEY_FILE"


class TlsSettingError(ConnectionError):
    """A TIDESHIFT_NATS_TLS_* variable names no usable file (or one of a pair is missing)."""


class TlsHandshakeError(ConnectionError):
    """The server and this client could not agree on TLS; the message names what to set
    (retrying cannot fix it, unlike a server that is not up yet)."""


def context_from_environment() -> ssl.SSLContext | None:
    """The TLS context TIDESHIFT_NATS_TLS_* describe, or None when none is set (nats-py then
    uses the system's CAs if the server requires TLS)."""
    ca, cert, key = (
        os.environ.get(name) or None
        for name in (TLS_CA_VARIABLE, TLS_CERT_VARIABLE, TLS_KEY_VARIABLE)
    )
    if ca is None and cert is None and key is None:
        return None
    if (cert is None) != (key is None):
        missing = TLS_KEY_VARIABLE if key is None else TLS_CERT_VARIABLE
        raise TlsSettingError(
            f"{missing}: expected a PEM file, given with {TLS_CERT_VARIABLE} and "
            f"{TLS_KEY_VARIABLE} together (a client certificate and its key)"
        )
    name = TLS_CA_VARIABLE
    try:
        context = ssl.create_default_context(cafile=ca)
        if cert is not None:
            name = f"{TLS_CERT_VARIABLE}/{TLS_KEY_VARIABLE}"
            context.load_cert_chain(cert, key)
    except (OSError, ValueError) as error:
        shown = " ".join(str(error).split())
        raise TlsSettingError(f"{name}: expected readable PEM files ({shown})") from None
    return context


def handshake_failure(error: ssl.SSLError, shown: str) -> str:
    """One line on a failed handshake naming what to set: the CA for an untrusted server,
    else the client certificate (a server that verifies clients ends the handshake of one
    without)."""
    reason = error.reason or str(error)
    if isinstance(error, ssl.SSLCertVerificationError):
        reason = f"certificate verify failed: {error.verify_message}"
        hint = f"set {TLS_CA_VARIABLE} to the CA bundle that signed the server's certificate"
    else:
        hint = (
            f"the server may require a client certificate: set {TLS_CERT_VARIABLE} "
            f"and {TLS_KEY_VARIABLE}"
        )
    return f"NATS at {shown}: TLS handshake failed ({reason}); {hint}"
