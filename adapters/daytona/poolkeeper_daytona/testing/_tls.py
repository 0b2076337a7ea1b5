"""A throwaway certificate authority for the emulator's TLS listener.

The keys and certificates are made by the ``openssl`` command at run time
(neither the SDK nor the adapter depends on ``cryptography``), in a
temporary folder that lives as long as the emulator. Nothing is trusted
outside the process that points its clients at :attr:`TLSFiles.ca_file`.
"""

from __future__ import annotations

import shutil
import ssl
import subprocess
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Final

if TYPE_CHECKING:
    from collections.abc import Callable

__all__ = ["TLSFiles", "make_tls_files"]

_OPENSSL_TIMEOUT: Final = 30.0
# Short-lived on purpose: an emulator lives minutes, not days.
_DAYS: Final = "2"
_CA_CONFIG: Final = """\
[req]
distinguished_name = dn
prompt = no
[dn]
CN = poolkeeper Daytona emulator CA
[ext]
basicConstraints = critical,CA:TRUE
keyUsage = critical,keyCertSign,cRLSign
subjectKeyIdentifier = hash
"""
# Python 3.13's default context verifies with VERIFY_X509_STRICT, which
# wants the key identifiers and a critical basicConstraints.
_SERVER_EXTENSIONS: Final = """\
basicConstraints = critical,CA:FALSE
keyUsage = critical,digitalSignature
extendedKeyUsage = serverAuth
subjectAltName = IP:127.0.0.1,DNS:localhost
subjectKeyIdentifier = hash
authorityKeyIdentifier = keyid
"""


@dataclass(frozen=True, slots=True)
class TLSFiles:
    """The files of one emulator's certificate authority and server.

    Attributes:
        directory: The temporary folder holding them all.
        ca_file: The CA certificate (PEM) that clients must trust.
        cert_file: The server certificate (PEM), for 127.0.0.1 and
            localhost, signed by the CA.
        key_file: The server's private key (PEM).
    """

    directory: Path
    ca_file: Path
    cert_file: Path
    key_file: Path

    def server_context(
        self, drop_handshake: Callable[[], bool]
    ) -> ssl.SSLContext:
        """Return a server-side context serving :attr:`cert_file`.

        Args:
            drop_handshake: Asked once per connection as its handshake
                starts; ``True`` closes the connection there, with no
                alert: the client reads an EOF in violation of protocol.
        """
        context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
        context.load_cert_chain(self.cert_file, self.key_file)
        context.sslobject_class = _dropping_sslobject(drop_handshake)
        return context

    def remove(self) -> None:
        """Delete the folder and its files; idempotent."""
        shutil.rmtree(self.directory, ignore_errors=True)


class HandshakeDroppedError(ssl.SSLError):
    """Raised in the emulator to drop a connection mid-handshake."""


def _dropping_sslobject(
    drop_handshake: Callable[[], bool],
) -> type[ssl.SSLObject]:
    # asyncio's SSL protocol calls do_handshake() once as the connection
    # opens, before any byte was read, then again as each flight arrives,
    # and treats an ssl.SSLError from it as a failed handshake: it closes
    # the TCP connection at once, sends nothing, and logs at DEBUG only.
    # Deciding at the second call, when the ClientHello has been read off
    # the socket, makes that close a FIN (unread bytes would make it a
    # RST): the client reads an EOF in violation of protocol, every time.
    # SSLContext.sslobject_class is the documented hook for this.
    class _DroppingSSLObject(ssl.SSLObject):
        _pk_calls = 0

        def do_handshake(self) -> None:
            self._pk_calls += 1
            if self._pk_calls == 2 and drop_handshake():  # noqa: PLR2004
                msg = "the Daytona emulator dropped this handshake"
                raise HandshakeDroppedError(msg)
            super().do_handshake()

    return _DroppingSSLObject


def _openssl(*args: str, cwd: Path) -> None:
    command = shutil.which("openssl")
    if command is None:
        msg = (
            "DaytonaEmulator(tls=True) needs the openssl command on PATH "
            "to make its certificates; install OpenSSL or use tls=False."
        )
        raise RuntimeError(msg)
    result = subprocess.run(  # noqa: S603 - fixed arguments, no shell.
        [command, *args],
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=_OPENSSL_TIMEOUT,
        check=False,
    )
    if result.returncode != 0:
        msg = (
            f"DaytonaEmulator(tls=True): 'openssl {args[0]}' failed "
            f"({result.returncode}): {result.stderr.strip()}"
        )
        raise RuntimeError(msg)


def make_tls_files() -> TLSFiles:
    """Make a CA and a server certificate for 127.0.0.1 in a new folder.

    Returns:
        The files; call :meth:`TLSFiles.remove` when done.

    Raises:
        RuntimeError: If ``openssl`` is missing or fails.
    """
    directory = Path(tempfile.mkdtemp(prefix="daytona-emulator-tls-"))
    try:
        (directory / "ca.cnf").write_text(_CA_CONFIG, encoding="ascii")
        (directory / "server.ext").write_text(
            _SERVER_EXTENSIONS, encoding="ascii"
        )
        new_key = ["-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:P-256"]
        _openssl(
            "req", "-x509", "-new", *new_key, "-nodes",
            "-keyout", "ca.key", "-out", "ca.pem", "-days", _DAYS,
            "-config", "ca.cnf", "-extensions", "ext",
            cwd=directory,
        )  # fmt: skip
        _openssl(
            "req", "-new", *new_key, "-nodes",
            "-keyout", "server.key", "-out", "server.csr",
            "-subj", "/CN=127.0.0.1",
            cwd=directory,
        )  # fmt: skip
        _openssl(
            "x509", "-req", "-in", "server.csr",
            "-CA", "ca.pem", "-CAkey", "ca.key", "-set_serial", "2",
            "-days", _DAYS, "-extfile", "server.ext", "-out", "server.pem",
            cwd=directory,
        )  # fmt: skip
    except BaseException:
        shutil.rmtree(directory, ignore_errors=True)
        raise
    return TLSFiles(
        directory=directory,
        ca_file=directory / "ca.pem",
        cert_file=directory / "server.pem",
        key_file=directory / "server.key",
    )
