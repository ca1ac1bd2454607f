"""The snapshot agent's only door to Cloud Storage.

Everything that talks to a bucket goes through :class:`ObjectStore`: small objects
(manifests), listing and deleting through google-cloud-storage, and the bulk part
transfers through the same JSON API with the same credentials, but at the media endpoints
directly (``uploadType=media`` and ``alt=media``), over the standard library's
``http.client``.

Why the bulk path uses neither the SDK's ``Blob.upload_from_file``/``download_to_file``
nor ``requests``: measured against fake-gcs-server on this machine, the library's
downloads go through 8 KiB chunks in Python (about 300-500 MiB/s, against 2 GiB/s for a
plain GET read into the target buffer in 1 MiB steps), and an upload above 8 MiB becomes a
resumable upload (two requests per object, chunk copies). And every transfer runs in the
kernel being paused or resumed: importing ``requests`` (and urllib3) there cost 60-90 ms of
every resume, while ipykernel has ``http.client`` loaded already. A part is sent straight
from the memory views of the live arrays (``socket.sendall`` of each view, no copy) and
received straight into the restore buffers.

Credentials: the process's Application Default Credentials, or, given ``access_token``, only
that token (``google.oauth2.credentials.Credentials``; on GKE the cluster monitor's downscoped
token for one snapshot or restore, limited to the workspace's own folder, which the sidecar
passes on to the kernel: ``functions.domain.snapshot_access``). A store with a token never
falls back to the default credentials, and the bulk path sends it without importing
google-auth in the kernel.

Emulator: when ``emulator_host`` (or ``STORAGE_EMULATOR_HOST``) is set, requests go to it
with anonymous credentials. The in-kernel code gets the host from the driver explicitly,
so a kernel whose environment lacks the variable cannot silently talk to real GCS.
"""

from __future__ import annotations

import http.client
import os
import threading
from collections.abc import Callable, Iterable, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any
from urllib.parse import quote, urlencode, urlsplit

from .errors import ObjectNotFound, StorageError, TransientStorageError

if TYPE_CHECKING:
    from google.cloud import storage

_SCOPES = ("https://www.googleapis.com/auth/devstorage.read_write",)
_GCS_ENDPOINT = "https://storage.googleapis.com"
_TIMEOUT_S = 120.0
_SEND_CHUNK = 1024 * 1024
_RECV_CHUNK = 1024 * 1024
_RETRYABLE_STATUS = frozenset({408, 429, 500, 502, 503, 504})


def emulator_from_env() -> str | None:
    """The ``STORAGE_EMULATOR_HOST`` of this process, or ``None``."""
    return os.environ.get("STORAGE_EMULATOR_HOST") or None


def _emulator_url(host: str) -> str:
    return host.rstrip("/") if "://" in host else f"http://{host.rstrip('/')}"


def _status_error(status: int, detail: str, what: str) -> StorageError:
    message = f"{what}: HTTP {status} {detail[:300].strip()}"
    if status == 404:
        return ObjectNotFound(message)
    if status in _RETRYABLE_STATUS:
        return TransientStorageError(message)
    return StorageError(message)


class _Connections:
    """One keep-alive HTTP connection per thread (the transfer workers each hold one)."""

    def __init__(self, endpoint: str) -> None:
        url = urlsplit(endpoint)
        self.https = url.scheme == "https"
        self.host = url.hostname or ""
        self.port = url.port
        self.base = url.path.rstrip("/")
        self._local = threading.local()

    def get(self) -> http.client.HTTPConnection:
        conn: http.client.HTTPConnection | None = getattr(self._local, "conn", None)
        if conn is None:
            cls = http.client.HTTPSConnection if self.https else http.client.HTTPConnection
            conn = cls(self.host, self.port, timeout=_TIMEOUT_S)
            self._local.conn = conn
        return conn

    def drop(self) -> None:
        """Forget this thread's connection after an error: the next request reconnects."""
        conn = getattr(self._local, "conn", None)
        self._local.conn = None
        if conn is not None:
            conn.close()


class ObjectStore:
    """A bucket client for the snapshot agent. Thread-safe; build one per process.

    The google-cloud-storage client (and google-auth) is imported and built only when a
    method needs it: a capture or a restore in a kernel only moves parts, and importing
    the SDK there would add about 0.3 s to every pause and resume.
    """

    def __init__(
        self,
        *,
        emulator_host: str | None = None,
        project: str | None = None,
        api_endpoint: str | None = None,
        access_token: str | None = None,
    ) -> None:
        host = emulator_host or emulator_from_env()
        self.emulator_host = host
        self.access_token = access_token or None
        self.project = project
        self.endpoint = _emulator_url(host) if host else (api_endpoint or _GCS_ENDPOINT).rstrip("/")
        self._credentials: Any = None
        self._client: storage.Client | None = None
        self._connections = _Connections(self.endpoint)
        self._lock = threading.Lock()

    def _get_credentials(self) -> Any:
        if self._credentials is None:
            if self.emulator_host:
                from google.auth.credentials import AnonymousCredentials

                self._credentials = AnonymousCredentials()  # type: ignore[no-untyped-call]
            elif self.access_token:
                from google.oauth2.credentials import Credentials

                self._credentials = Credentials(token=self.access_token)  # type: ignore[no-untyped-call]
            else:
                import google.auth
                from google.auth.exceptions import DefaultCredentialsError

                try:
                    self._credentials, default_project = google.auth.default(scopes=_SCOPES)
                except DefaultCredentialsError as error:
                    raise StorageError(
                        "no Google credentials for Cloud Storage (the local stack sets "
                        f"STORAGE_EMULATOR_HOST): {error}"
                    ) from error
                self.project = self.project or default_project
        return self._credentials

    @property
    def client(self) -> storage.Client:
        """The google-cloud-storage client (built on first use)."""
        with self._lock:
            if self._client is None:
                from google.cloud import storage

                credentials = self._get_credentials()
                options = {"api_endpoint": self.endpoint}
                project = self.project or ("stasis-local" if self.emulator_host else None)
                self._client = storage.Client(
                    project=project, credentials=credentials, client_options=options
                )
            return self._client

    def _auth_headers(self) -> dict[str, str]:
        """``Authorization`` for Cloud Storage (refreshed when it expires); none for the
        emulator, so a kernel talking to it imports no auth library at all."""
        if self.emulator_host:
            return {}
        if self.access_token:  # handed in for this operation: never refreshed here
            return {"Authorization": f"Bearer {self.access_token}"}
        with self._lock:
            credentials = self._get_credentials()
            if not credentials.valid:
                from google.auth.transport.requests import Request

                credentials.refresh(Request())
            return {"Authorization": f"Bearer {credentials.token}"}

    # -- bulk parts -----------------------------------------------------------------------

    def _media_path(self, bucket: str, name: str | None, params: dict[str, str]) -> str:
        base = self._connections.base
        if name is None:
            return f"{base}/upload/storage/v1/b/{quote(bucket, safe='')}/o?{urlencode(params)}"
        return (
            f"{base}/download/storage/v1/b/{quote(bucket, safe='')}/o/{quote(name, safe='')}"
            f"?{urlencode(params)}"
        )

    def upload_chunks(
        self,
        bucket: str,
        name: str,
        chunks: Sequence[memoryview],
        *,
        on_piece: Callable[[memoryview], None] | None = None,
    ) -> int:
        """Store the concatenation of ``chunks`` as ``gs://bucket/name`` in one request.

        ``on_piece`` sees every piece once, in order, as it is sent (for progress).
        Returns the number of bytes sent.
        """
        what = f"upload gs://{bucket}/{name}"
        size = sum(c.nbytes for c in chunks)
        path = self._media_path(bucket, None, {"uploadType": "media", "name": name})
        headers = {"Content-Type": "application/octet-stream", "Content-Length": str(size),
                   **self._auth_headers()}
        conn = self._connections.get()
        sent = 0
        try:
            conn.putrequest("POST", path, skip_accept_encoding=True)
            for key, value in headers.items():
                conn.putheader(key, value)
            conn.endheaders()
            for chunk in chunks:
                for start in range(0, chunk.nbytes, _SEND_CHUNK):
                    piece = chunk[start : start + _SEND_CHUNK]
                    conn.send(piece)
                    sent += piece.nbytes
                    if on_piece is not None:
                        on_piece(piece)
            response = conn.getresponse()
            body = response.read()
        except (OSError, http.client.HTTPException) as error:
            self._connections.drop()
            raise TransientStorageError(f"{what}: {error}") from error
        if response.status >= 300:
            raise _status_error(response.status, body.decode(errors="replace"), what)
        return sent

    def download_into(
        self,
        bucket: str,
        name: str,
        targets: Sequence[memoryview],
        *,
        on_data: Callable[[memoryview], None],
    ) -> int:
        """Read ``gs://bucket/name`` into ``targets`` in order; return the object's size.

        ``on_data`` sees every filled slice once, while it is hot in cache (the caller
        hashes it). An object longer than ``targets`` is read to its end but not stored,
        and the returned size tells the caller it does not match.
        """
        what = f"download gs://{bucket}/{name}"
        conn = self._connections.get()
        try:
            conn.request("GET", self._media_path(bucket, name, {"alt": "media"}),
                         headers={"Accept-Encoding": "identity", **self._auth_headers()})
            response = conn.getresponse()
            if response.status >= 300:
                detail = response.read().decode(errors="replace")
                raise _status_error(response.status, detail, what)
            received = 0
            for target in targets:
                filled = 0
                while filled < target.nbytes:
                    view = target[filled : filled + _RECV_CHUNK]
                    n = response.readinto(view)
                    if not n:
                        self._connections.drop()  # the body ended early
                        return received
                    on_data(view[:n])
                    filled += n
                    received += n
            while extra := response.read(_RECV_CHUNK):
                received += len(extra)
        except (OSError, http.client.HTTPException) as error:
            self._connections.drop()
            raise TransientStorageError(f"{what}: {error}") from error
        except BaseException:
            # A failure between reads (a hash callback that stops the transfer) leaves
            # the response half read: this connection cannot carry another request.
            self._connections.drop()
            raise
        return received

    # -- small objects, listing, deleting -------------------------------------------------

    @contextmanager
    def _sdk_errors(self, what: str) -> Iterator[None]:
        from google.api_core import exceptions as gexc

        try:
            yield
        except gexc.NotFound as error:
            raise ObjectNotFound(f"{what}: not found ({error.message})") from error
        except (gexc.TooManyRequests, gexc.ServerError) as error:
            raise TransientStorageError(f"{what}: {error.message}") from error
        except gexc.GoogleAPICallError as error:
            raise StorageError(f"{what}: {error.message}") from error

    def put_bytes(self, bucket: str, name: str, data: bytes, content_type: str) -> None:
        """Store a small object (a manifest) in one request."""
        with self._sdk_errors(f"upload gs://{bucket}/{name}"):
            self.client.bucket(bucket).blob(name).upload_from_string(
                data, content_type=content_type
            )

    def get_bytes(self, bucket: str, name: str) -> bytes:
        """Read a small object; :class:`ObjectNotFound` if it is not there."""
        with self._sdk_errors(f"read gs://{bucket}/{name}"):
            data: bytes = self.client.bucket(bucket).blob(name).download_as_bytes()
        return data

    def list_objects(self, bucket: str, prefix: str) -> dict[str, int]:
        """``{name: size}`` of every object whose name starts with ``prefix``."""
        with self._sdk_errors(f"list gs://{bucket}/{prefix}"):
            return {
                blob.name: int(blob.size or 0)
                for blob in self.client.list_blobs(bucket, prefix=prefix)
            }

    def delete_objects(self, bucket: str, names: Iterable[str], *, streams: int = 8) -> int:
        """Delete ``names`` in parallel; a name already gone counts as deleted."""
        handle = self.client.bucket(bucket)

        def delete(name: str) -> None:
            try:
                with self._sdk_errors(f"delete gs://{bucket}/{name}"):
                    handle.blob(name).delete()
            except ObjectNotFound:
                pass

        names = list(names)
        with ThreadPoolExecutor(max(1, min(streams, len(names)))) as pool:
            list(pool.map(delete, names))
        return len(names)


_STORES: dict[str | None, ObjectStore] = {}
_STORES_LOCK = threading.Lock()


_TOKEN_STORES: dict[tuple[str | None, str], ObjectStore] = {}
#: Stores kept per access token: one per operation in flight is plenty.
_TOKEN_STORES_MAX = 8


def get_store(emulator_host: str | None = None, *,
              access_token: str | None = None) -> ObjectStore:
    """The process-wide :class:`ObjectStore` for an endpoint (built on first use), or, with
    ``access_token``, one that uses only that token."""
    host = emulator_host or emulator_from_env()
    if access_token:
        with _STORES_LOCK:
            key = (host, access_token)
            store = _TOKEN_STORES.get(key)
            if store is None:
                if len(_TOKEN_STORES) >= _TOKEN_STORES_MAX:
                    _TOKEN_STORES.pop(next(iter(_TOKEN_STORES)))
                store = _TOKEN_STORES[key] = ObjectStore(emulator_host=host,
                                                         access_token=access_token)
            return store
    with _STORES_LOCK:
        store = _STORES.get(host)
        if store is None:
            store = _STORES[host] = ObjectStore(emulator_host=host)
        return store
