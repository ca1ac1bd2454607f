"""Turning a kernel's user namespace into bytes and back. No I/O.

What is captured: the kernel's globals minus IPython machinery (:func:`user_variables`).

How it is pickled:

- cloudpickle, protocol 5, with a ``buffer_callback``: every contiguous buffer of at least
  ``inband_below`` bytes (numpy arrays, pandas blocks) goes *out of band* as a memory view
  of the live object, so capturing a 1 GiB array copies nothing; small buffers stay in the
  stream, where one more object would cost more than the copy.
- Device arrays (torch tensors and their storages, JAX arrays; see ``devices``) become
  segments of their own too, with a *placement* that says which library rebuilds them and
  on which device they were: a CPU storage as a view of its memory, a GPU one as a source
  the transfer copies to host part by part. In the stream they are a token that the load
  resolves to the restored segment.
- One :class:`pickle.Pickler` dumps ``(name, value)`` pairs one after the other. Its memo
  persists across dumps (as the Unpickler's does across loads), so objects shared between
  variables stay shared after restore, and the stream position after each dump tells how
  many bytes each variable cost.
- Functions defined in the notebook (their ``__globals__`` is the namespace) are pickled
  bound to the *namespace itself*, not to a copy of the globals they referenced, which is
  what plain cloudpickle does. After restore they see the live namespace, as they did
  before: a ``global counter`` update is visible to the notebook, and a function that
  references an unpicklable variable (a lock) is still captured; calling it after restore
  raises ``NameError`` for that one name, which the skipped list explains.
- Modules pickle by reference, so ``np`` comes back by re-import.
- If a variable cannot be pickled, each variable is tried alone (out-of-band buffers are
  discarded, so trying a large array costs no copy); the ones that fail are recorded with
  their type and the reason and the rest is pickled together again.
"""

from __future__ import annotations

import contextvars
import io
import pickle
import re
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import cloudpickle
from cloudpickle import cloudpickle as _cp

from . import devices

PROTOCOL = 5
DEFAULT_INBAND_BELOW = 1024 * 1024

# Names IPython puts in the user namespace. Hidden names are also taken from the shell's
# ``user_ns_hidden`` when the capture runs in a kernel (see ``user_variables``).
_IPYTHON_NAMES = frozenset({"In", "Out", "exit", "quit", "get_ipython", "open"})
# Output and input history aliases: _, __, ___, _5, _i, _ii, _iii, _i5, _ih, _oh, _dh,
# _exit_code; dunders (__name__, __builtins__ ...) are module machinery.
_IPYTHON_PRIVATE = re.compile(r"^(_{1,3}|_i{1,3}|_i?\d+|_[iod]h|_exit_code|__\w+__)$")
_MAX_REASON = 300


@dataclass(frozen=True)
class CapturedVariable:
    name: str
    type: str
    bytes: int


@dataclass(frozen=True)
class SkippedVariable:
    name: str
    type: str
    reason: str


@dataclass
class NamespaceDump:
    """The result of :func:`dump_namespace`: segments that reference live memory.

    ``segments[0]`` is the pickle stream, the rest are out-of-band buffers and device
    segments (memory views, or ``DeviceSource``s for accelerator memory), with
    ``placements[i]`` None for a pickle buffer and ``{"kind", "device"}`` for a device
    segment. The views are of the user's objects: call :meth:`release` once they are
    stored, or the user's ``bytearray``s cannot be resized afterwards.
    """

    segments: list[Any]
    captured: list[CapturedVariable]
    skipped: list[SkippedVariable]
    placements: list[dict[str, Any] | None] = field(default_factory=list)
    _keep: list[Any] = field(default_factory=list, repr=False)

    @property
    def total_bytes(self) -> int:
        return sum(s.nbytes for s in self.segments)

    def release(self) -> None:
        for view in self.segments:
            if isinstance(view, memoryview):
                view.release()
        for obj in self._keep:
            if isinstance(obj, (pickle.PickleBuffer, memoryview)):
                obj.release()
        self.segments = []
        self._keep = []


def type_name(value: Any) -> str:
    """``dict``, ``numpy.ndarray``, ``__main__.Point``: what the manifest shows."""
    cls = type(value)
    if cls.__module__ == "builtins":
        return cls.__qualname__
    return f"{cls.__module__}.{cls.__qualname__}"


def user_variables(
    namespace: Mapping[str, Any], hidden: Mapping[str, Any] | None = None
) -> list[str]:
    """Names of the user's variables in ``namespace``, in definition order.

    Left out: IPython's history and output aliases, dunders, ``In``/``Out``/``exit``/
    ``quit``/``get_ipython``, and any name in ``hidden`` (IPython's ``user_ns_hidden``)
    still bound to the object IPython put there; a user who rebinds ``exit`` gets it
    captured. Private user names such as ``_cache`` *are* captured: notebook functions
    often rely on them, and they are not IPython's.
    """
    hidden = hidden or {}
    names = []
    for name, value in namespace.items():
        if name in _IPYTHON_NAMES or _IPYTHON_PRIVATE.match(name):
            continue
        if name in hidden and hidden[name] is value:
            continue
        names.append(name)
    return names


# -- the pickler ---------------------------------------------------------------------------


class _NamespaceToken:
    """Stands for "the namespace being restored into" inside the pickle stream."""


_NAMESPACE = _NamespaceToken()
_TARGET: contextvars.ContextVar[dict[str, Any]] = contextvars.ContextVar("stasis_target")
_SEGMENTS: contextvars.ContextVar[Callable[[int], Any]] = contextvars.ContextVar(
    "stasis_segments")


def _bound_namespace() -> dict[str, Any]:
    """Unpickling hook: the namespace that notebook functions are rebound to."""
    try:
        return _TARGET.get()
    except LookupError:
        raise pickle.UnpicklingError(
            "this stream binds notebook functions to a kernel namespace; "
            "load it with runtime.snapshot.pickling.load_namespace"
        ) from None


def _segment(index: int) -> Any:
    """Unpickling hook: the restored segment (a device array's storage) ``index``."""
    try:
        return _SEGMENTS.get()(index)
    except LookupError:
        raise pickle.UnpicklingError(
            "this stream refers to device segments; load it with "
            "runtime.snapshot.pickling.load_namespace"
        ) from None


class _NamespacePickler(cloudpickle.Pickler):  # type: ignore[misc]
    """cloudpickle that pickles ``namespace``-global functions bound to the namespace, and
    device arrays as segments (``devices.Reducers``)."""

    def __init__(
        self,
        file: io.BytesIO,
        namespace: Mapping[str, Any],
        buffer_callback: Callable[[pickle.PickleBuffer], bool],
        reducers: devices.Reducers,
    ) -> None:
        super().__init__(file, protocol=PROTOCOL, buffer_callback=buffer_callback)
        self._namespace = namespace
        self._reducers = reducers

    def reducer_override(self, obj: Any) -> Any:
        if obj is _NAMESPACE:
            return (_bound_namespace, ())
        if type(obj) is devices.Token:
            return (_segment, (obj.index,))
        reduced = self._reducers.reduce(obj)
        if reduced is not NotImplemented:
            return reduced
        return super().reducer_override(obj)

    def _dynamic_function_reduce(self, func: Any) -> Any:
        if func.__globals__ is not self._namespace:
            return super()._dynamic_function_reduce(func)
        code, _copied_globals, name, argdefs, closure = self._function_getnewargs(func)
        state, slotstate = _cp._function_getstate(func)
        # The referenced globals come back with the namespace itself; pickling them here
        # would also drag unpicklable neighbours (a lock) into the function.
        slotstate["__globals__"] = {}
        return (
            _cp._make_function,
            (code, _NAMESPACE, name, argdefs, closure),
            (state, slotstate),
            None,
            None,
            _cp._function_setstate,
        )


class _VariableFailed(Exception):
    def __init__(self, name: str, error: Exception) -> None:
        super().__init__(name)
        self.name = name
        self.error = error


def _reason(error: BaseException) -> str:
    text = f"{type(error).__name__}: {error}"
    return text if len(text) <= _MAX_REASON else text[: _MAX_REASON - 1] + "…"


@dataclass
class _Dump:
    stream: io.BytesIO
    segments: list[Any]
    placements: list[dict[str, Any] | None]
    keep: list[Any]
    captured: list[CapturedVariable]


def _dump_all(namespace: Mapping[str, Any], names: Sequence[str], inband_below: int) -> _Dump:
    stream = io.BytesIO()
    segments: list[Any] = []  # segment i + 1 of the dump (0 is the stream)
    placements: list[dict[str, Any] | None] = []
    keep: list[Any] = []

    def out_of_band(buffer: pickle.PickleBuffer) -> bool:
        try:
            view = buffer.raw()
        except BufferError:  # not contiguous: let pickle decide in-band
            return True
        if view.nbytes < inband_below:
            view.release()
            return True
        keep.append(buffer)
        segments.append(view)
        placements.append(None)
        return False

    def register(segment: Any, placement: dict[str, Any]) -> devices.Token:
        segments.append(segment)
        placements.append(placement)
        return devices.Token(len(segments))

    pickler = _NamespacePickler(stream, namespace, out_of_band, devices.Reducers(register, keep))
    captured = []
    for name in names:
        value = namespace[name]
        start, first_segment = stream.tell(), len(segments)
        try:
            pickler.dump((name, value))
        except Exception as error:  # any failure to pickle is a reason to skip
            for view in segments:
                if isinstance(view, memoryview):
                    view.release()
            raise _VariableFailed(name, error) from error
        size = stream.tell() - start + sum(s.nbytes for s in segments[first_segment:])
        captured.append(CapturedVariable(name, type_name(value), size))
    return _Dump(stream, segments, placements, keep, captured)


def _probe(namespace: Mapping[str, Any], name: str) -> Exception | None:
    """Pickle one variable alone, discarding out-of-band buffers (no large copies)."""
    try:
        reducers = devices.Reducers(lambda _segment, _placement: devices.Token(0), [])
        _NamespacePickler(io.BytesIO(), namespace, lambda _buffer: False, reducers).dump(
            (name, namespace[name])
        )
    except Exception as error:
        return error
    return None


def dump_namespace(
    namespace: Mapping[str, Any],
    names: Iterable[str],
    *,
    inband_below: int = DEFAULT_INBAND_BELOW,
) -> NamespaceDump:
    """Pickle ``names`` of ``namespace``; never raises for an unpicklable variable.

    The first attempt pickles everything in one stream. If a variable fails, every
    variable is tried alone to find all that fail, and the rest is pickled again, so a
    namespace with ``k`` bad variables costs about two passes, not ``k``.
    """
    remaining = list(names)
    skipped: list[SkippedVariable] = []
    probed = False
    while True:
        try:
            dump = _dump_all(namespace, remaining, inband_below)
            break
        except _VariableFailed as failed:
            bad = {failed.name: failed.error}
            if not probed:
                probed = True
                for name in remaining:
                    error = _probe(namespace, name)
                    if error is not None:
                        bad[name] = error
            for name, error in bad.items():
                skipped.append(SkippedVariable(name, type_name(namespace[name]), _reason(error)))
            remaining = [n for n in remaining if n not in bad]
    main = dump.stream.getbuffer()
    order = {name: i for i, name in enumerate(namespace)}
    skipped.sort(key=lambda s: order.get(s.name, 0))
    return NamespaceDump(
        segments=[main.cast("B"),
                  *(s.cast("B") if isinstance(s, memoryview) else s for s in dump.segments)],
        captured=dump.captured,
        skipped=skipped,
        placements=[None, *dump.placements],
        _keep=[*dump.segments, *dump.keep, main, dump.stream],
    )


class _MemoryReader:
    """Read-only file over a memory view, so unpickling a large stream copies nothing."""

    def __init__(self, view: memoryview) -> None:
        self._view = view
        self._pos = 0

    def remaining(self) -> int:
        return len(self._view) - self._pos

    def read(self, n: int = -1) -> bytes:
        end = len(self._view) if n is None or n < 0 else min(len(self._view), self._pos + n)
        data = bytes(self._view[self._pos : end])
        self._pos = end
        return data

    def readinto(self, target: memoryview | bytearray) -> int:
        n = min(len(target), self.remaining())
        memoryview(target).cast("B")[:n] = self._view[self._pos : self._pos + n]
        self._pos += n
        return n

    def readline(self) -> bytes:
        # Only protocol-0 opcodes read lines; they are short.
        line = bytearray()
        while self.remaining():
            chunk = self.read(256)
            newline = chunk.find(b"\n")
            if newline >= 0:
                line += chunk[: newline + 1]
                self._pos -= len(chunk) - newline - 1
                break
            line += chunk
        return bytes(line)


def load_namespace(
    restored: Sequence[Any],
    target: dict[str, Any],
    *,
    placements: Sequence[Mapping[str, Any] | None] | None = None,
    to_cpu: bool = False,
) -> dict[str, Any]:
    """Unpickle the segments of a :func:`dump_namespace` (``restored[0]`` the stream)
    into a new dict, without applying it.

    ``placements`` (the dump's) say which segments are device arrays; ``to_cpu`` puts
    every device array on CPU. Notebook functions come back bound to ``target`` (the
    kernel's globals), so the caller applies the result with ``target.update(result)``.
    ``target`` itself is not changed, except for names that a restored object writes on
    its own while it is rebuilt.
    """
    placements = list(placements) if placements is not None else [None] * len(restored)
    if len(placements) != len(restored):
        raise ValueError(f"{len(restored)} segments but {len(placements)} placements")
    main = restored[0]
    buffers = [restored[i] for i in range(1, len(restored)) if placements[i] is None]
    reader = _MemoryReader(memoryview(main).cast("B"))
    unpickler = pickle.Unpickler(reader, buffers=buffers)
    token = _TARGET.set(target)
    segments = _SEGMENTS.set(devices.loader(list(placements), list(restored), to_cpu=to_cpu))
    missing = object()
    # cloudpickle's function setstate writes __builtins__ into the function's globals.
    builtins_before = target.get("__builtins__", missing)
    result: dict[str, Any] = {}
    try:
        while reader.remaining():
            name, value = unpickler.load()
            result[name] = value
    finally:
        _TARGET.reset(token)
        _SEGMENTS.reset(segments)
        if builtins_before is missing:
            target.pop("__builtins__", None)
        else:
            target["__builtins__"] = builtins_before
    return result
