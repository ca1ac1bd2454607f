"""Count the Firestore reads and writes one client makes, at the RPC level (tests, benchmarks).

The Firestore emulator keeps no usage figures, so the proof that "a sweep in which nothing
changed writes nothing" is taken where every request leaves the client: the GAPIC client
under ``firestore.Client``. Reads are counted as Firestore bills them, one per document
returned (``RunQuery``, ``BatchGetDocuments``, ``GetDocument``, ``ListDocuments``; a query
that matches nothing costs one read); writes are the documents in every ``Commit`` and
``BatchWrite`` (a transaction's writes included).

    meter = FirestoreMeter.install(db)
    ...                         # anything that uses ``db``
    meter.reads, meter.writes, meter.calls
"""

from __future__ import annotations

import threading
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any


@dataclass
class FirestoreMeter:
    reads: int = 0
    writes: int = 0
    calls: Counter[str] = field(default_factory=Counter)
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False)

    @classmethod
    def install(cls, client: Any) -> FirestoreMeter:
        """Wrap ``client``'s GAPIC client; everything it sends from now on is counted."""
        meter = cls()
        api = client._firestore_api  # builds the GAPIC client if it is not built yet
        client._firestore_api_internal = _Metered(api, meter)
        return meter

    def reset(self) -> None:
        with self._lock:
            self.reads = self.writes = 0
            self.calls.clear()

    def snapshot(self) -> dict[str, Any]:
        with self._lock:
            return {"reads": self.reads, "writes": self.writes, "calls": dict(self.calls)}

    def _add_reads(self, n: int) -> None:
        with self._lock:
            self.reads += n

    def _count(self, call: str, *, reads: int = 0, writes: int = 0) -> None:
        with self._lock:
            self.calls[call] += 1
            self.reads += reads
            self.writes += writes


class _Metered:
    """The GAPIC client with counting in front of the calls that read or write."""

    def __init__(self, api: Any, meter: FirestoreMeter) -> None:
        self._api = api
        self._meter = meter

    def __getattr__(self, name: str) -> Any:
        return getattr(self._api, name)

    def commit(self, request: Any = None, **kwargs: Any) -> Any:
        self._meter._count("commit", writes=len(_get(request, "writes")))
        return self._api.commit(request=request, **kwargs)

    def batch_write(self, request: Any = None, **kwargs: Any) -> Any:
        self._meter._count("batch_write", writes=len(_get(request, "writes")))
        return self._api.batch_write(request=request, **kwargs)

    def get_document(self, request: Any = None, **kwargs: Any) -> Any:
        self._meter._count("get_document", reads=1)
        return self._api.get_document(request=request, **kwargs)

    def run_query(self, request: Any = None, **kwargs: Any) -> Any:
        return _CountedStream(self._api.run_query(request=request, **kwargs), self._meter,
                              "run_query", lambda r: bool(getattr(r, "document", None)
                                                          and r.document.name))

    def batch_get_documents(self, request: Any = None, **kwargs: Any) -> Any:
        return _CountedStream(self._api.batch_get_documents(request=request, **kwargs),
                              self._meter, "batch_get_documents",
                              lambda r: True)

    def list_documents(self, request: Any = None, **kwargs: Any) -> Any:
        pages = self._api.list_documents(request=request, **kwargs)
        self._meter._count("list_documents")
        return _CountedStream(pages, self._meter, "list_documents_item", lambda r: True,
                              count_call=False)


class _CountedStream:
    """Passes a server stream through, counting one read per document in it (and one for
    a query that returned none, as Firestore bills it)."""

    def __init__(self, stream: Any, meter: FirestoreMeter, call: str, is_doc: Any,
                 count_call: bool = True) -> None:
        self._stream = stream
        self._it = iter(stream)
        self._meter = meter
        self._is_doc = is_doc
        self._call = call
        self._docs = 0
        self._ended = False
        if count_call:
            meter._count(call)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._stream, name)

    def __iter__(self) -> Iterator[Any]:
        return self

    def __next__(self) -> Any:
        try:
            response = next(self._it)
        except StopIteration:
            if not self._ended and self._docs == 0 and self._call == "run_query":
                self._meter._count("run_query_empty", reads=1)
            self._ended = True
            raise
        if self._is_doc(response):
            self._docs += 1
            self._meter._add_reads(1)
        return response


def _get(request: Any, name: str) -> list[Any]:
    if request is None:
        return []
    if isinstance(request, dict):
        return list(request.get(name) or [])
    return list(getattr(request, name, None) or [])
