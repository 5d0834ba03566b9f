"""systemd's readiness protocol (``sd_notify``), in a few lines of stdlib.

A unit with ``Type=notify`` sets ``NOTIFY_SOCKET`` (a Unix datagram socket; a leading
``@`` means the abstract namespace); the service sends ``READY=1`` once it serves and
``STOPPING=1`` when it begins to stop. Without ``NOTIFY_SOCKET`` nothing is sent.
"""

from __future__ import annotations

import logging
import os
import socket

log = logging.getLogger(__name__)


class SystemdNotifier:
    """Sends state lines to systemd's notification socket, if the engine has one.

    Args:
        address: The socket (``NOTIFY_SOCKET``'s value); ``None`` or empty sends nothing.
    """

    def __init__(self, address: str | None) -> None:
        self._address: str | None = None
        if not address:
            return
        if address.startswith("@"):
            self._address = "\0" + address[1:]  # the abstract namespace
        elif address.startswith("/"):
            self._address = address
        else:
            log.warning("NOTIFY_SOCKET %r is not a Unix socket path; not notifying", address)

    @classmethod
    def from_environ(cls) -> SystemdNotifier:
        """The notifier for ``NOTIFY_SOCKET``, removed from the environment (as
        ``sd_notify(unset_environment=1)`` does): the launcher the engine starts, and so
        every job, inherits the engine's environment, and they must not speak for it."""
        return cls(os.environ.pop("NOTIFY_SOCKET", None))

    @property
    def enabled(self) -> bool:
        """Whether there is a socket to notify."""
        return self._address is not None

    def notify(self, *lines: str) -> bool:
        """Send ``lines`` (``"READY=1"``, ``"STATUS=..."``) as one datagram; ``True`` if it
        was sent. A failure is logged, never raised: readiness is advice to systemd."""
        if self._address is None:
            return False
        try:
            with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM | socket.SOCK_CLOEXEC) as sock:
                sock.connect(self._address)
                sock.sendall("\n".join(lines).encode())
        except OSError as err:
            log.warning("could not notify systemd (%s): %s", lines[0] if lines else "", err)
            return False
        return True
