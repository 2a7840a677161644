"""The bytes as JSON text: gzip (bounded, concatenated members, a cut-off stream), byte-order marks, UTF-16 and
UTF-32 re-encoded as UTF-8, and lone UTF-16 surrogate escapes replaced (polars and UTF-8 refuse them)."""

from __future__ import annotations

import os
import re
import shlex
import zlib

from attntrace.read.errors import TraceError
from attntrace.read.raw import Buffer

NON_SPACE = re.compile(rb"[^ \t\r\n]")


UTF16_BOMS = (b"\xff\xfe", b"\xfe\xff")


UTF32_BOMS = (b"\xff\xfe\x00\x00", b"\x00\x00\xfe\xff")


def may_be_a_trace(head: bytes) -> bool:
    """Whether a stream's first bytes could begin a trace: gzip, a byte-order mark, or JSON's { or [ after
    whitespace (all whitespace so far counts as could)."""
    if head.startswith((b"\x1f\x8b", b"\xef\xbb\xbf", *UTF16_BOMS, *UTF32_BOMS)):
        return True
    first = NON_SPACE.search(head)
    return first is None or head[first.start():first.start() + 1] in (b"{", b"[")


# Other compressions and archives, by their first bytes: what the file holds, and the command that makes it traces
# ({file} is the file's name; {stem} its name without the suffixes of traces and archives; {out} a new file's).
_OTHER_FORMATS: tuple[tuple[bytes, str, str], ...] = (
    (b"BZh", "bz2-compressed data", "bunzip2 -c {file} > {out}"),
    (b"\x28\xb5\x2f\xfd", "zstd-compressed data", "zstd -dc {file} > {out}"),
    (b"\xfd7zXZ\x00", "xz-compressed data", "xz -dc {file} > {out}"),
    (b"PK\x03\x04", "a zip archive", "unzip {file} -d {stem}, then lint {stem}"),
    (b"PK\x05\x06", "an empty zip archive", "unzip -l {file}"),
    (b"7z\xbc\xaf\x27\x1c", "a 7z archive", "7z x {file} -o{stem}, then lint {stem}"),
    (b"\x04\x22\x4d\x18", "lz4-compressed data", "lz4 -dc {file} > {out}"),
    # LZMA's older format (.lzma, lzma_alone) has no magic: its usual properties byte (lc=3, lp=0, pb=2) and a
    # dictionary size under 16 MiB begin it, and no JSON text begins with "]".
    (b"\x5d\x00\x00", "LZMA-compressed data (.lzma)", "xz --format=lzma -dc {file} > {out}"),
)
GZIP_MAGIC = b"\x1f\x8b"
# A compressed tar, told by its name (its first bytes are the compression's, and a bz2 block is read whole before
# any of it comes out): the compression, and tar's option for it.
_COMPRESSED_TARS: dict[bytes, tuple[str, str]] = {
    b"BZh": ("bzip2", "-xjf"), b"\x28\xb5\x2f\xfd": ("zstd", "--zstd -xf"), b"\xfd7zXZ\x00": ("xz", "-xJf")}
_TAR_NAME = re.compile(r"\.(tar\.(bz2|zst|zstd|xz)|tbz2?|tzst|txz)$", re.IGNORECASE)
_ARCHIVE_SUFFIXES = re.compile(r"(\.(json|gz|tgz|tbz|tbz2|txz|tzst|bz2|zst|zstd|xz|lzma|lz4|zip|7z|tar))+$",
                               re.IGNORECASE)


def _new_file_name(bare: str, base: str) -> str:
    """A name for the unpacked trace, in the folder where the command runs, that is neither the file itself (the
    shell would empty it before it is read: xz.json > xz.json) nor a file already there (a.json beside a.json.xz
    would be replaced)."""
    candidates = [f"{bare}.json", f"{bare}.unpacked.json", *(f"{bare}.unpacked.{n}.json" for n in range(1, 100))]
    return next((c for c in candidates if c != base and not os.path.lexists(c)), candidates[-1])


NSYS_REPORT_SUFFIXES = (".nsys-rep", ".qdrep")  # Nsight Systems' own format (.qdrep before 2021.3)


def nsys_export_command(name: str) -> str:
    """The command that makes the SQLite export attntrace reads from an Nsight Systems report."""
    out = re.sub(r"\.(nsys-rep|qdrep)$", "", name) + ".sqlite"
    return f"nsys export --type sqlite --output {shlex.quote(out)} {shlex.quote(name)}, then lint {shlex.quote(out)}"


def other_format(head: bytes, name: str = "FILE", gzipped: bool = False) -> TraceError | None:
    """Why bytes that begin with `head` are no trace when they are another compression or an archive (bz2, zstd,
    xz, zip, 7z, tar), with the command that extracts them from the file `name`; None otherwise. `gzipped`: these
    are a gzip stream's contents (a .tar.gz)."""
    file = shlex.quote(name)
    base = os.path.basename(name)
    bare = _ARCHIVE_SUFFIXES.sub("", base) or "traces"
    out = shlex.quote(_new_file_name(bare, base))
    stem = shlex.quote(bare)
    if gzipped and head.startswith(GZIP_MAGIC):  # compressed twice: attntrace undoes one gzip, as Kineto writes one
        return TraceError("unsupported", f"the gzip stream holds another gzip stream (compressed twice): "
                          f"gunzip -c {file} > {out}, then lint {out}")
    for magic, what, command in _OTHER_FORMATS:
        if head.startswith(magic) and (magic != b"BZh" or head[3:4].isdigit()):
            if gzipped:
                return TraceError("unsupported", f"the gzip stream holds {what}, not JSON")
            if magic in _COMPRESSED_TARS and _TAR_NAME.search(base):
                compression, flags = _COMPRESSED_TARS[magic]
                return TraceError("unsupported", f"a tar archive ({compression}-compressed), not a trace: "
                                  f"mkdir {stem} && tar {flags} {file} -C {stem}, then lint {stem}")
            return TraceError("unsupported", f"{what}, not a trace (attntrace reads JSON and gzip): "
                              f"{command.format(file=file, stem=stem, out=out)}")
    if base.endswith(NSYS_REPORT_SUFFIXES):
        return TraceError("unsupported", f"an Nsight Systems report, not a trace (attntrace reads its SQLite export): "
                          f"{nsys_export_command(name)}")
    # A tar member's header: its name first, the format's magic at 257. Text that starts as JSON does is no tar (a
    # trace with "ustar" at byte 257 of a string was refused as one).
    if head[257:262] == b"ustar" and not may_be_a_trace(head.removeprefix(b"\xef\xbb\xbf")):
        flags = "xzf" if gzipped else "xf"
        return TraceError("unsupported", f"a tar archive{' (gzip-compressed)' if gzipped else ''}, not a trace: "
                          f"mkdir {stem} && tar -{flags} {file} -C {stem}, then lint {stem}")
    return None


def gunzip(data: Buffer, max_bytes: int, salvage: bool, name: str = "FILE") -> tuple[bytearray, bool]:
    # Decompress in bounded chunks so that a gzip bomb is stopped at the limit, not after it fills memory,
    # and garbage is refused after the first chunk, not after all of it.
    out = bytearray()
    decomp = zlib.decompressobj(wbits=47)
    pending: Buffer = data
    if isinstance(data, bytearray):  # a stream's buffer, which grows: let it go for a copy of its bytes
        pending = bytes(data)
        del data[:]
    try:
        while pending:
            chunk = decomp.decompress(pending, 1 << 24)
            if not out:
                _sniff_json(chunk, name)
            out += chunk
            if len(out) > max_bytes:
                raise TraceError("too-large", f"gzip expands past the limit of {max_bytes} bytes (--max-size)")
            pending = decomp.unconsumed_tail
            if decomp.eof and decomp.unused_data:
                # Zero padding (tape blocks) between or after members is skipped, as gzip -d and Python's gzip
                # do; another member then goes on. Other bytes (a second file appended to this one) are refused
                # as a plain file's trailing characters are: gzip -d warns of them, Python's gzip refuses them.
                pending = bytes(decomp.unused_data).lstrip(b"\0")
                if not pending:
                    break
                if not pending.startswith(b"\x1f\x8b"):
                    if salvage:
                        break
                    raise TraceError("bad-gzip", f"{len(pending)} bytes after the gzip stream that are not gzip (a "
                                     "file appended to it?)")
                # A second gzip member follows (concatenated gzip files are valid gzip).
                decomp = zlib.decompressobj(wbits=47)
    except zlib.error as exc:
        if not (salvage and out):
            raise TraceError("bad-gzip", f"not a valid gzip stream ({exc})") from exc
        return out, True
    if not decomp.eof:
        if not salvage:
            raise TraceError("truncated", "gzip stream is cut off (--salvage analyses the complete events)")
        return out, True
    return out, False


def _sniff_json(head: bytes, name: str) -> None:
    other = other_format(head[:512], name, gzipped=True)
    if other is not None:
        raise other
    if wide_codec(head[:4]) is not None:  # UTF-16 or UTF-32 JSON, which the decoder re-encodes
        return
    body = head.removeprefix(b"\xef\xbb\xbf")
    first = NON_SPACE.search(body)
    if first is not None and body[first.start():first.start() + 1] not in b"{[":
        raise TraceError("not-json", "the gzip stream does not hold JSON (it starts with "
                         f"{body[first.start():first.start() + 12]!r})")


def wide_codec(head: bytes) -> str | None:
    """The codec of UTF-16 or UTF-32 text (as Windows tools write it) from its first 4 bytes, or None."""
    if head.startswith(UTF32_BOMS):
        return "utf-32"
    if head.startswith(UTF16_BOMS):
        return "utf-16"
    if len(head) >= 4 and head[1:2] == head[3:4] == b"\x00" and head[:1] in b"{[ \t\r\n":
        return "utf-16-le"
    if len(head) >= 4 and head[0:1] == head[2:3] == b"\x00" and head[1:2] in b"{[ \t\r\n":
        return "utf-16-be"
    return None


def utf16_to_utf8(data: Buffer) -> bytearray | None:
    """UTF-16 or UTF-32 text re-encoded as UTF-8, or None when it is not (wide_codec)."""
    codec = wide_codec(bytes(data[:4]))
    if codec is None:
        return None
    try:
        return bytearray(bytes(data).decode(codec).encode("utf-8", "surrogatepass"))
    except UnicodeError as exc:
        raise TraceError("not-json", f"{codec.upper()} text that does not decode ({exc.reason} at byte "
                         f"{exc.start})") from exc


# A \uD800-\uDFFF escape: half of a surrogate pair. Alone it is not a character (polars and UTF-8 refuse it).
SURROGATE = re.compile(rb"\\u[dD][89a-fA-F][0-9a-fA-F]{2}")


# A surrogate written out as UTF-8 bytes (CESU-8, or a writer that encoded a lone surrogate): not valid UTF-8,
# yet the decoder keeps it, and Python's str then holds a code point that no UTF-8 output can take.
RAW_SURROGATE = re.compile(rb"\xed[\xa0-\xbf][\x80-\xbf]")
REPLACEMENT_UTF8 = "\ufffd".encode()


def replace_raw_surrogates(data: bytearray) -> int:
    """Replace each surrogate written as three UTF-8 bytes with U+FFFD's three bytes, in place (offsets stay);
    return how many. A pair written that way (CESU-8) becomes two replacement characters."""
    count = 0
    for match in RAW_SURROGATE.finditer(data):
        data[match.start():match.end()] = REPLACEMENT_UTF8
        count += 1
    return count


def replace_lone_surrogates(data: bytearray) -> int:
    """Replace each \\uD800-\\uDFFF escape that is not half of a pair with \\uFFFD, in place (same length,
    so offsets stay); return how many. Pairs (emoji) are kept."""
    count = 0
    skip_until = -1
    for match in SURROGATE.finditer(data):
        start = match.start()
        if start < skip_until:
            continue
        before = start
        while before > 0 and data[before - 1] == 0x5C:  # backslashes before this one
            before -= 1
        if (start - before) % 2:
            continue  # an escaped backslash followed by the text "ud800"
        high = match.group()[3:4].lower() in b"89ab"
        follower = data[start + 6:start + 12]
        if high and SURROGATE.fullmatch(follower) and follower[3:4].lower() in b"cdef":
            skip_until = start + 12
            continue
        data[start:start + 6] = b"\\ufffd"
        count += 1
    return count
