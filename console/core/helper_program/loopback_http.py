"""``http_get``: one GET to a port on this machine's loopback (a serving endpoint's ``/metrics``, inside the
place the helper runs in): never another address, no redirect followed, a deadline over the whole exchange,
the body bounded."""

import http.client
import ipaddress
import time

HTTP_LIMIT = 4 * 1024 * 1024  # bytes of body at most
HTTP_TIMEOUT_S = 10.0


def _loopback(host):
    if host == "localhost":
        return "127.0.0.1"
    try:
        if ipaddress.ip_address(host).is_loopback:
            return host
    except ValueError:
        pass
    raise ValueError(f"http_get reaches loopback addresses only, not {host!r}")


def op_http_get(req):
    host = _loopback(str(req.get("host", "")))
    port, path = int(req["port"]), str(req.get("path", "/"))
    if not 0 < port < 65536 or not path.startswith("/") or any(c in path for c in "\r\n "):
        raise ValueError("bad port or path")
    timeout = min(float(req.get("timeout", HTTP_TIMEOUT_S)), 60.0)
    limit = min(int(req.get("limit", HTTP_LIMIT)), HTTP_LIMIT)
    deadline = time.monotonic() + timeout
    conn = http.client.HTTPConnection(host, port, timeout=timeout)
    try:
        conn.request("GET", path, headers={"Accept": "text/plain"})
        sock = conn.sock  # the response reads through it (the connection may let go of it)
        resp = conn.getresponse()
        body = bytearray()
        while len(body) <= limit:
            left = deadline - time.monotonic()
            if left <= 0:
                raise TimeoutError(f"no whole answer within {timeout:.0f} s")
            sock.settimeout(left)
            chunk = resp.read1(65536)
            if not chunk:
                break
            body += chunk
        if len(body) > limit:
            raise ValueError(f"the answer is over {limit} bytes")
        return {"status": resp.status, "body": body.decode("utf-8", "replace")}
    finally:
        conn.close()
