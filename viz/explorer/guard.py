"""Who may use the explorer. A local web server with no login must not serve other sites' pages, so it is defended
as Jupyter and TensorBoard defend theirs:

- DNS rebinding (a page on evil.example whose name is made to point at 127.0.0.1 reads it as its own site): the
  Host header must be a name the server listens as: 127.0.0.1, localhost, ::1 and --host (listening on every
  interface, any IP address and this machine's name), since a rebinding page can only send its own name;
- cross-site requests (a page on another site posting to 127.0.0.1): a request whose Origin is not the page's own is
  refused, an API request a browser marks cross-site (Sec-Fetch-Site) too, and the API takes only application/json
  bodies, which a browser sends to another site only after a preflight (OPTIONS) that this server never approves.
Scripts (curl, Python) send no Origin and are served.
"""
from __future__ import annotations

import ipaddress
import socket
from urllib.parse import urlsplit

from viz.explorer.request import RequestError

LOOPBACK = frozenset({"127.0.0.1", "localhost", "::1"})
EVERY_INTERFACE = frozenset({"", "0.0.0.0", "::"})


def _ip(name: str) -> bool:
    try:
        ipaddress.ip_address(name)
    except ValueError:
        return False
    return True


class Hosts:
    """The host names a server answers as: listening on `listen` (its --host) bound to the address `bound`."""

    def __init__(self, listen: str, bound: str = ""):
        self.every = listen in EVERY_INTERFACE
        mine = {listen.lower(), bound.lower(), socket.gethostname().lower() if self.every else ""}
        self.names = (LOOPBACK | mine) - {""}

    def allows(self, name: str) -> bool:
        return name in self.names or (self.every and _ip(name))

    def listed(self) -> str:
        return ", ".join(sorted(self.names)) + (" or any IP address" if self.every else "")


def _host_name(host: str) -> str:
    """The name in a Host header ("127.0.0.1:8000", "[::1]:8000", "localhost"), lowercase; the port does not
    matter (a rebinding page sends its own name, whatever the port)."""
    try:
        return urlsplit("//" + host).hostname or ""
    except ValueError:  # an unclosed [
        raise RequestError(f"the request's Host {host[:100]!r} is not a host name", 400) from None


def check(headers, hosts: Hosts, api: bool) -> None:
    """RequestError (403 and one line) unless the request is for this server (Host) from its own page (Origin)."""
    hosts_sent = headers.get_all("Host", [])
    if len(hosts_sent) != 1 or not hosts_sent[0]:
        count = f"{len(hosts_sent)} Host headers" if len(hosts_sent) > 1 else "no Host header"
        raise RequestError(f"the request has {count}: send one, Host: 127.0.0.1:PORT (as every HTTP/1.1 client "
                           "does)", 400)
    host = hosts_sent[0]
    name = _host_name(host)
    if not hosts.allows(name):
        raise RequestError(f"the request is for host {name[:100]!r}, not an address this explorer listens as "
                           f"({hosts.listed()}): open it by one of those", 403)
    origin = headers.get("Origin")
    if origin is not None and origin.lower() != f"http://{host.lower()}":  # a browser writes both from the URL
        raise RequestError(f"the request comes from the page at {origin[:100]!r}, another site: only the explorer's "
                           "own page may use it", 403)
    if api and headers.get("Sec-Fetch-Site", "same-origin") not in ("same-origin", "none"):
        raise RequestError("the request comes from another site's page (Sec-Fetch-Site: "
                           f"{headers['Sec-Fetch-Site'][:30]}): only the explorer's own page may use the API", 403)


def check_json_body(headers) -> None:
    """RequestError (415) unless the body is declared application/json: a browser posts that to another site only
    after a preflight, where text/plain or a form needs none."""
    kind = headers.get("Content-Type", "")
    if kind.split(";", 1)[0].strip().lower() != "application/json":
        raise RequestError(f"the body's Content-Type is {kind[:60]!r}: send JSON with Content-Type: application/json",
                           415)
