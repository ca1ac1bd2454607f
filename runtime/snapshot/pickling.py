"""Turning a kernel's user namespace into bytes and back. No I/O.

What is captured: the kernel's globals minus IPython machinery (:func:`user_variables`).

How it is pickled:

- cloudpickle, protocol 5, with a ``buffer_callback``: every contiguous buffer of at least
  ``inband_below`` bytes (numpy arrays, pandas blocks) goes *out of band* as a memory view
  of the live object, so capturing a 1 GiB array copies nothing; small buffers stay in the
  stream, where one more object would cost more than the copy.
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
import mmap
import pickle
import re
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import cloudpickle
from cloudpickle import cloudpickle as _cp

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

    ``segments[0]`` is the pickle stream, the rest are out-of-band buffers. They are views
    of the user's objects: call :meth:`release` once they are stored, or the user's
    ``bytearray``s cannot be resized afterwards.
    """

    segments: list[memoryview]
    captured: list[CapturedVariable]
    skipped: list[SkippedVariable]
    _keep: list[Any] = field(default_factory=list, repr=False)

    @property
    def total_bytes(self) -> int:
        return sum(s.nbytes for s in self.segments)

    def release(self) -> None:
        for view in self.segments:
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


def _bound_namespace() -> dict[str, Any]:
    """Unpickling hook: the namespace that notebook functions are rebound to."""
    try:
        return _TARGET.get()
    except LookupError:
        raise pickle.UnpicklingError(
            "this stream binds notebook functions to a kernel namespace; "
            "load it with runtime.snapshot.pickling.load_namespace"
        ) from None


class _NamespacePickler(cloudpickle.Pickler):  # type: ignore[misc]
    """cloudpickle that pickles ``namespace``-global functions bound to the namespace."""

    def __init__(
        self,
        file: io.BytesIO,
        namespace: Mapping[str, Any],
        buffer_callback: Callable[[pickle.PickleBuffer], bool],
    ) -> None:
        super().__init__(file, protocol=PROTOCOL, buffer_callback=buffer_callback)
        self._namespace = namespace

    def reducer_override(self, obj: Any) -> Any:
        if obj is _NAMESPACE:
            return (_bound_namespace, ())
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


def _dump_all(
    namespace: Mapping[str, Any], names: Sequence[str], inband_below: int
) -> tuple[io.BytesIO, list[pickle.PickleBuffer], list[memoryview], list[CapturedVariable]]:
    stream = io.BytesIO()
    buffers: list[pickle.PickleBuffer] = []
    views: list[memoryview] = []

    def out_of_band(buffer: pickle.PickleBuffer) -> bool:
        try:
            view = buffer.raw()
        except BufferError:  # not contiguous: let pickle decide in-band
            return True
        if view.nbytes < inband_below:
            view.release()
            return True
        buffers.append(buffer)
        views.append(view)
        return False

    pickler = _NamespacePickler(stream, namespace, out_of_band)
    captured = []
    for name in names:
        value = namespace[name]
        start, first_buffer = stream.tell(), len(views)
        try:
            pickler.dump((name, value))
        except Exception as error:  # any failure to pickle is a reason to skip
            for view in views:
                view.release()
            raise _VariableFailed(name, error) from error
        size = stream.tell() - start + sum(v.nbytes for v in views[first_buffer:])
        captured.append(CapturedVariable(name, type_name(value), size))
    return stream, buffers, views, captured


def _probe(namespace: Mapping[str, Any], name: str) -> Exception | None:
    """Pickle one variable alone, discarding out-of-band buffers (no large copies)."""
    try:
        _NamespacePickler(io.BytesIO(), namespace, lambda _buffer: False).dump(
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
            stream, buffers, views, captured = _dump_all(namespace, remaining, inband_below)
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
    main = stream.getbuffer()
    order = {name: i for i, name in enumerate(namespace)}
    skipped.sort(key=lambda s: order.get(s.name, 0))
    return NamespaceDump(
        segments=[main.cast("B"), *(v.cast("B") for v in views)],
        captured=captured,
        skipped=skipped,
        _keep=[*views, *buffers, main, stream],
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
    main: memoryview | bytes | bytearray | mmap.mmap,
    buffers: Sequence[Any],
    target: dict[str, Any],
) -> dict[str, Any]:
    """Unpickle a stream from :func:`dump_namespace` into a new dict, without applying it.

    Notebook functions come back bound to ``target`` (the kernel's globals), so the caller
    applies the result with ``target.update(result)``. ``target`` itself is not changed,
    except for names that a restored object writes on its own while it is rebuilt.
    """
    reader = _MemoryReader(memoryview(main).cast("B"))
    unpickler = pickle.Unpickler(reader, buffers=buffers)
    token = _TARGET.set(target)
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
        if builtins_before is missing:
            target.pop("__builtins__", None)
        else:
            target["__builtins__"] = builtins_before
    return result
