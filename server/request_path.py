"""One normalisation of a request's path, before routing and before its body limit (issue #43).

The body limit was chosen from the raw target (`/%761/responses` is no `/v1/` path: another
limit) while routing used the server's decoded path (`/v1/responses`: the proxy). Both now use
`normalized`: the query dropped, percent-escapes decoded (as Daphne and uvicorn decode the ASGI
`path`), runs of `/` collapsed and `.` / `..` segments resolved, so every spelling of a path
gets the same route and the same limit.
"""

from __future__ import annotations

from urllib.parse import unquote_to_bytes


def normalized(target: bytes) -> bytes:
    """The path of a raw request target (bytes as sent; the query is dropped)."""
    path = unquote_to_bytes(target.split(b"?", 1)[0])
    if b"//" not in path and b"/." not in path:
        return path or b"/"
    out: list[bytes] = []
    segments = path.split(b"/")
    for segment in segments[1:]:
        if segment in (b"", b"."):
            continue
        if segment == b"..":
            if out:
                out.pop()
            continue
        out.append(segment)
    trailing = segments[-1] in (b"", b".", b"..") and bool(out)
    return b"/" + b"/".join(out) + (b"/" if trailing else b"")


def normalized_text(path: str) -> str:
    """The same for an ASGI `path` (already decoded: only the slashes and dot segments)."""
    if "//" not in path and "/." not in path:
        return path
    return normalized(path.replace("%", "%25").encode("utf-8", "surrogateescape")).decode(
        "utf-8", "surrogateescape"
    )
