"""What the read layer and the sources below it share: the error an unusable input raises, and which file names
are traces. A module of its own so that `sources` (URLs) needs nothing of the read layer, which uses it."""

from __future__ import annotations

TRACE_SUFFIXES = (".json", ".json.gz")
# The names torch.profiler's tensorboard_trace_handler and export_chrome_trace examples give: a file so named that
# cannot be read is a broken trace, never other JSON that a directory scan passes over.
PROFILER_TRACE_SUFFIXES = (".pt.trace.json", ".pt.trace.json.gz")
# Only the API can be given such a path: os calls raised "embedded null byte", which named no input.
NUL_IN_PATH = "the path holds a NUL byte, which no file name can"


class TraceError(Exception):
    """An input that cannot be analysed; the message is one line and names no file (the caller does)."""

    def __init__(self, kind: str, message: str, path: str | None = None) -> None:
        super().__init__(message)
        self.kind = kind
        self.message = message
        self.path = path  # set when the error is about a path other than the one being read
