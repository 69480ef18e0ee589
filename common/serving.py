"""A local HTTP server started and run, for explore.py and serve.py alike: an address that cannot
be listened on is one line (the port in use, or why not); the server runs until Ctrl-C, then closes.
"""
from __future__ import annotations

import errno


def listen(make, host: str, port: int, other: str):
    """make(): a server on host:port, or a one-line ValueError; `other`: what may hold the port."""
    try:
        return make()
    except OSError as e:
        if e.errno == errno.EADDRINUSE:
            raise ValueError(f"port {port} is in use ({other}?): pass another --port, or --port 0 "
                             f"for a free one") from None
        raise ValueError(f"cannot listen on {host}:{port} ({e.strerror or e}): check --host and "
                         f"--port") from None


def serve(server, line: str) -> int:
    """Print `line` (the address), then serve until stopped; the socket closes whatever ends it."""
    print(line, flush=True)
    try:
        server.serve_forever()
    finally:
        server.server_close()
    return 0
