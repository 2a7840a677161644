"""Traces given as URLs (s3://, gs://, az://, http(s)://, file://), read through fsspec: listing prefixes and
globs like directories, and reading one object in a bounded stream. fsspec and its protocol packages are
optional extras, imported only when a URL is given."""

from __future__ import annotations

import contextlib
import errno
import os
import re
import socket
from collections.abc import Callable, Iterator
from typing import Any
from urllib.parse import unquote, urlsplit, urlunsplit

from attntrace.install import pip_install
from attntrace.read.errors import TRACE_SUFFIXES, TraceError

_URL = re.compile(r"^[A-Za-z][A-Za-z0-9+.-]+://")
_GLOB = re.compile(r"[*?\[]")
READ_CHUNK_BYTES = 8 << 20  # one request's worth: large enough for object stores, small against --max-size
HTTP_TIMEOUT_S = 30.0  # a web server that accepts and then says nothing for this long is an error
# And one request (up to READ_CHUNK_BYTES, or a whole body where the server takes no ranges) may take this long:
# a server that sends a byte now and then kept the read alive for ever, and the traces beside it unreported.
HTTP_REQUEST_S = 60.0

# The package each protocol needs, and the extra that installs it.
EXTRA_OF = {
    "s3": "s3", "s3a": "s3", "gs": "gcs", "gcs": "gcs", "az": "azure", "abfs": "azure", "abfss": "azure",
    "adl": "azure", "http": "remote", "https": "remote",
}
# Environment variables whose values are secrets: scrubbed from any message a backend puts in an error.
SECRET_VARIABLES = ("AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN", "AWS_SECURITY_TOKEN", "AZURE_STORAGE_KEY",
                    "AZURE_STORAGE_ACCOUNT_KEY", "AZURE_STORAGE_SAS_TOKEN", "AZURE_STORAGE_CONNECTION_STRING",
                    "AZURE_CLIENT_SECRET", "GOOGLE_OAUTH_ACCESS_TOKEN")


def is_url(path: str) -> bool:
    return bool(_URL.match(path))


def local_path(url: str) -> str | None:
    """The path a file:// URL of this machine names, or None for any other URL (and for one that names no path,
    which `url_problem` refuses: "file://" was read as "/", and the whole machine was walked). Such a URL is read
    as the path is, with the guards a local file gets (a FIFO without a writer, /dev/zero, a directory's FIFOs)."""
    with contextlib.suppress(ValueError):  # no URL at all (an unclosed "[")
        parts = urlsplit(url)
        if parts.scheme.lower() == "file" and parts.netloc in ("", "localhost") and parts.path:
            return unquote(parts.path)
    return None


# Object stores: the URL's host is the bucket or container, which every object lives in.
_BUCKETED = {"s3", "s3a", "gs", "gcs", "az", "abfs", "abfss", "adl"}


def url_problem(url: str) -> str | None:
    """Why `url` names nothing that can be read, before any backend is asked (they said "no such object" or
    raised an internal error): not a URL by Python's rules (an unclosed IPv6 "[", a port that is no number or
    past 65535), or no host, bucket or path where its scheme needs one. None for a URL to try."""
    try:
        parts = urlsplit(url)
        parts.port  # noqa: B018 - read for urlsplit's check of the port, made only when it is read
    except ValueError as exc:
        return f"not a valid URL ({exc})"
    scheme = parts.scheme.lower()
    if scheme == "file" and not parts.path:
        return "the URL names no path (file:///folder/trace.json)"
    if scheme in ("http", "https") and not parts.hostname:
        return f"the URL names no host ({scheme}://HOST/folder/trace.json)"
    if scheme in _BUCKETED and not parts.netloc:
        return f"the URL names no bucket ({scheme}://BUCKET/folder/trace.json)"
    return None


def shown(url: str) -> str:
    """The URL as it may be printed: without a password. (A query string stays: it is part of what names the
    object, and the user typed it.)"""
    try:
        parts = urlsplit(url)
    except ValueError:  # no URL by Python's rules (url_problem says so): nothing in it is read as a password
        return url
    if not parts.password:
        return url
    host = parts.hostname or ""
    netloc = f"{host}:{parts.port}" if parts.port else host
    if parts.username:
        netloc = f"{parts.username}:***@{netloc}"
    return urlunsplit((parts.scheme, netloc or parts.netloc, parts.path, parts.query, parts.fragment))


def scrub(message: str, url: str = "") -> str:
    """One line of a backend's error, with any secret it might echo (from the environment or the URL) removed."""
    line = (message.strip().splitlines() or [""])[0]
    secrets = [os.environ.get(name, "") for name in SECRET_VARIABLES]
    if url:
        with contextlib.suppress(ValueError):
            secrets.append(urlsplit(url).password or "")
        line = line.replace(url, shown(url))
    for secret in sorted(filter(None, secrets), key=len, reverse=True):
        line = line.replace(secret, "***")
    return line[:300]


def _filesystem(url: str) -> tuple[Any, str]:
    protocol = url.split("://", 1)[0].lower()
    url = protocol + url[len(protocol):]  # schemes are case-insensitive (RFC 3986); fsspec knows them in lower case
    extra = EXTRA_OF.get(protocol)
    try:
        import fsspec
    except ImportError as exc:
        if extra is None and protocol != "file":  # fsspec alone cannot read it: its backend is another package
            raise TraceError("unsupported", f"reading {protocol}:// URLs needs fsspec and its {protocol}:// backend, "
                             f"which no extra of attntrace installs: {pip_install('remote')}, then the package "
                             "fsspec names for it") from exc
        raise TraceError("unsupported", f"reading {protocol}:// URLs needs the [{extra or 'remote'}] extra (fsspec): "
                         f"{pip_install(extra or 'remote')}") from exc
    options: dict[str, Any] = {}
    if protocol in ("http", "https"):
        try:
            import aiohttp  # fsspec's HTTP backend: without a read timeout, a server that never answers hangs the run
        except ImportError as exc:  # fsspec alone (another package's dependency): its HTTP backend needs aiohttp
            raise TraceError("unsupported", f"reading {protocol}:// URLs needs the [remote] extra (fsspec and "
                             f"aiohttp; aiohttp is missing): {pip_install('remote')}") from exc

        options["client_kwargs"] = {"timeout": aiohttp.ClientTimeout(total=HTTP_REQUEST_S, sock_connect=HTTP_TIMEOUT_S,
                                                                     sock_read=HTTP_TIMEOUT_S)}
    try:
        return fsspec.core.url_to_fs(url, **options)
    except ImportError as exc:
        if extra is None:  # hf://, sftp://, hdfs://...: the [remote] extra does not have their backends
            missing = getattr(exc.__cause__, "name", None) or exc.name
            package = f" (the module {missing!r})" if missing else ""
            raise TraceError("unsupported", f"{protocol}:// needs a package that is not installed "
                             f"({scrub(str(exc))}); no extra of attntrace installs it: pip install fsspec's "
                             f"backend for {protocol}://{package}") from exc
        raise TraceError("unsupported", f"{protocol}:// needs a package that is not installed "
                         f"({scrub(str(exc))}): {pip_install(extra)}") from exc
    except ValueError as exc:
        raise TraceError("unsupported", f"{protocol}:// is not a protocol fsspec knows ({scrub(str(exc), url)})") \
            from exc


def _timed_out() -> TraceError:
    return TraceError("unreadable", f"the server did not answer within {HTTP_TIMEOUT_S:g} s, or sent too slowly (one "
                      f"request of up to {READ_CHUNK_BYTES >> 20} MiB took over {HTTP_REQUEST_S:g} s)")


# A network that cannot be reached: with no route or no name server, aiohttp's error (an OSError of this errno,
# or a name lookup's gaierror beneath it) came wrapped in FileNotFoundError, and was said as "no such object".
NO_NETWORK = {errno.ECONNREFUSED, errno.ENETUNREACH, errno.EHOSTUNREACH, errno.ECONNRESET, errno.ENETDOWN,
              errno.EHOSTDOWN, errno.ECONNABORTED}


def _no_connection(exc: BaseException) -> bool:
    return isinstance(exc, ConnectionError | socket.gaierror) or (isinstance(exc, OSError)
                                                                  and exc.errno in NO_NETWORK)


def _failure(exc: BaseException, url: str, doing: str) -> TraceError:
    """A backend's exception as a one-line TraceError; the caller names the URL."""
    if isinstance(exc, TraceError):
        return exc
    # The exception and what it was raised from: fsspec's HTTP backend reports every failed request as not found,
    # and a timeout comes as its own FSTimeoutError or inside that.
    causes: list[BaseException] = []
    cause: BaseException | None = exc
    while cause is not None and len(causes) < 8:
        causes.append(cause)
        cause = cause.__cause__ or cause.__context__
    if any(isinstance(c, TimeoutError) or "Timeout" in type(c).__name__ for c in causes):
        return _timed_out()
    if isinstance(exc, FileNotFoundError):
        refused = next((c for c in causes if _no_connection(c)), None)
        if refused is not None:
            return TraceError("unreadable", f"cannot connect ({scrub(str(refused), url) or type(refused).__name__})")
        # An answer other than "not found" (500, 403, a redirect loop) is said as it was.
        if any("Redirect" in type(c).__name__ for c in causes):
            return TraceError("unreadable", "too many redirects")
        status = next((c.status for c in causes if isinstance(getattr(c, "status", None), int) and c.status), None)
        if status is not None and status != 404:
            return TraceError("unreadable", f"the server answered HTTP {status}")
        return TraceError("not-found", "no such object, bucket or prefix")
    if isinstance(exc, PermissionError):
        return TraceError("denied", f"access denied while {doing} (check the backend's credentials: "
                          "environment variables or its config file)")
    if isinstance(exc, IsADirectoryError):
        return TraceError("unreadable", "is a directory")
    detail = scrub(str(exc), url) or type(exc).__name__
    return TraceError("unreadable", f"cannot {doing.removesuffix('ing')} ({type(exc).__name__}: {detail})")


def _is_trace_name(path: str) -> bool:
    return path.endswith(TRACE_SUFFIXES)


def discover(given: str) -> Iterator[tuple[str, str | None] | TraceError]:
    """Expand one URL as `read.inputs.discover` expands a local path: a glob or a prefix ("directory") becomes its
    trace objects, sorted; yield (url, the prefix or glob it was found under, else None) or why the URL is
    unusable."""
    name = shown(given)
    problem = url_problem(given)
    if problem is not None:
        yield TraceError("usage", problem, path=name)
        return
    if urlsplit(given).password:
        yield TraceError("unsupported", "a password in the URL is refused; give credentials through "
                         "the backend's environment variables or config file", path=name)
        return
    try:
        fs, path = _filesystem(given)
        protocols = {fs.protocol} if isinstance(fs.protocol, str) else set(fs.protocol)
        if protocols & {"http", "https"}:
            # A web server has no listing that fsspec can trust: the URL is one file, read as it is. A glob or a
            # prefix cannot be expanded there: said, not fetched literally (an answer for any path was read as
            # one trace under the glob's name).
            if _GLOB.search(urlsplit(given).path) or urlsplit(given).path.endswith("/"):
                yield TraceError("unsupported", "an http(s) URL names one file: a web server has no listing to "
                                 "expand a glob or a prefix with (s3://, gs:// and az:// have)", path=name)
                return
            yield given, None
            return
        if _GLOB.search(path):
            matches = fs.glob(path, detail=True)  # the listing says which are files: no request per match
            found = sorted(p for p, info in matches.items() if _is_trace_name(p) and info.get("type") == "file")
            if not found:
                yield TraceError("not-found", "no trace objects (*.json, *.json.gz) match", path=name)
            yield from ((fs.unstrip_protocol(p), name) for p in found)
            return
        info = fs.info(path)
        if info.get("type") != "directory":
            yield given, None
            return
        found = sorted(p for p in fs.find(path) if _is_trace_name(p))
        if not found:
            yield TraceError("not-found", "no trace objects (*.json, *.json.gz) under this prefix", path=name)
        yield from ((fs.unstrip_protocol(p), name) for p in found)
    except Exception as exc:  # a backend raises its own types; each becomes that URL's one-line error
        failure = _failure(exc, given, "listing")
        yield TraceError(failure.kind, failure.message, path=name)


def read_bytes(url: str, max_bytes: int, may_be_a_trace: Callable[[bytes], bool] = bool) -> bytearray:
    """The object's bytes as they are stored (gzip is handled by the reader, as for a file), read in a
    stream of bounded requests and refused once they pass max_bytes: a gzip file larger than the limit
    cannot expand to less than it. An object whose first request cannot start a trace (`may_be_a_trace`: not
    JSON, gzip or UTF-16) is not read further: the reader says why from those bytes (an endless body)."""
    problem = url_problem(url)
    if problem is not None:
        raise TraceError("usage", problem)
    try:
        fs, path = _filesystem(url)
        with fs.open(path, "rb", block_size=READ_CHUNK_BYTES, cache_type="none") as fh:
            size = getattr(fh, "size", None)
            if isinstance(size, int) and size > max_bytes:
                raise TraceError("too-large", f"{size} bytes is over the limit of {max_bytes} bytes (--max-size)")
            data = bytearray()
            while chunk := fh.read(READ_CHUNK_BYTES):
                first = not data
                data += chunk
                if first and not may_be_a_trace(bytes(data)):
                    break
                if len(data) > max_bytes:
                    raise TraceError("too-large", f"more than {max_bytes} bytes, the limit (--max-size)")
        return data
    except Exception as exc:  # a backend raises its own types; each becomes that URL's one-line error
        raise _failure(exc, url, "reading") from None
