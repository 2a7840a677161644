"""The trace events and document as the decoder types them: the fields the model reads, typed by phase.

Kept apart from the reader, without postponed annotations, so that msgspec reads real types here instead of
evaluating the annotations' strings (180 compiles at every start)."""

import functools
import operator
from typing import Any, ClassVar

import msgspec

NO_VALUE = msgspec.Raw()  # an args field kept raw that the event does not have


class Args(msgspec.Struct, gc=False, omit_defaults=True):
    external_id: int | None = msgspec.field(name="External id", default=None)
    external_id_old: int | None = msgspec.field(name="external id", default=None)
    correlation: int | None = None
    registers: int | None = msgspec.field(name="registers per thread", default=None)
    shared_memory: int | None = msgspec.field(name="shared memory", default=None)
    blocks_per_sm: float | None = msgspec.field(name="blocks per SM", default=None)
    grid: list[int] | None = None
    block: list[int] | None = None
    occupancy: float | None = msgspec.field(name="est. achieved occupancy %", default=None)
    device: int | None = None
    stream: int | None = None
    bytes: int | None = None
    input_dims: msgspec.Raw = msgspec.field(name="Input Dims", default=NO_VALUE)
    input_types: msgspec.Raw = msgspec.field(name="Input type", default=NO_VALUE)
    concrete_inputs: msgspec.Raw = msgspec.field(name="Concrete Inputs", default=NO_VALUE)
    input_strides: msgspec.Raw = msgspec.field(name="Input Strides", default=NO_VALUE)


class TraceEvent(msgspec.Struct, gc=False, tag_field="ph"):
    """One trace event, typed by its phase ("ph"). The model reads complete, begin/end and flow events; the
    others (memory instants, metadata, counters: a fifth of a training trace) are parsed past without
    building their fields."""
    ph: ClassVar[str] = ""
    cat: ClassVar[str] = ""
    name: ClassVar[str] = ""
    ts: ClassVar[float | None] = None


class Event(TraceEvent):
    """The fields of the events the model reads."""
    cat: str = ""
    name: str = ""
    pid: int | str = 0
    tid: int | str = 0
    ts: float | None = None
    dur: float | None = None
    id: int | str | None = None
    args: Args | None = None


def _phase_struct(name: str, phase: str, base: type[TraceEvent]) -> Any:
    """The struct of one phase: tagged with it, and its `ph` a class attribute (read by attrgetter("ph") like a
    field, stored in no event)."""
    return msgspec.defstruct(name, [], bases=(base,), tag=phase, namespace={"ph": phase}, gc=False)


# The phases the model reads, with the fields of Event.
Complete, Begin, End, FlowStart, FlowStep, FlowEnd = (
    _phase_struct(name, phase, Event) for name, phase in (("Complete", "X"), ("Begin", "B"), ("End", "E"),
                                                           ("FlowStart", "s"), ("FlowStep", "t"), ("FlowEnd", "f")))


class Unphased(TraceEvent):
    """An event without a phase the Trace Event Format knows (only made when events are coerced one by one)."""


READ_PHASES: dict[str, type[Event]] = {c.ph: c for c in (Complete, Begin, End, FlowStart, FlowStep, FlowEnd)}
# Every other phase of the Trace Event Format: decoded as an empty struct of its own.
SKIPPED_PHASES: dict[str, type[TraceEvent]] = {
    ph: _phase_struct(f"Skipped_{i}", ph, TraceEvent)
    for i, ph in enumerate(("i", "I", "M", "C", "b", "n", "e", "P", "N", "O", "D", "V", "v", "R", "c", "(", ")",
                            "T", "p", "S", "F"))}
AnyEvent: Any = functools.reduce(operator.or_, [*READ_PHASES.values(), *SKIPPED_PHASES.values()])


class Metadata(msgspec.Struct, gc=False, kw_only=True):
    """The document's fields other than its events, as JSON gave them: the model keeps those of the type it expects
    and notes the others (model.header). Typed here, one odd field (`"record_shapes": true`, a `distributedInfo`
    list) failed the typed decode of the whole document, which then went through Python objects: all of the
    header lost, and 4x the memory on a large trace."""
    deviceProperties: Any = None
    schemaVersion: Any = None
    displayTimeUnit: Any = None
    baseTimeNanoseconds: Any = None
    record_shapes: Any = None
    with_stack: Any = None
    profile_memory: Any = None
    with_flops: Any = None
    with_modules: Any = None
    cuda_driver_version: Any = None
    cuda_runtime_version: Any = None
    cupti_version: Any = None
    distributedInfo: Any = None
    attntrace_measured: Any = None  # the steps timed without the profiler (attntrace.profile; model/measured.py)


class Document(Metadata):
    traceEvents: list[AnyEvent]


class Outline(Metadata):
    """The document with its event list left undecoded: where the list ends, whatever follows it."""
    traceEvents: msgspec.Raw
