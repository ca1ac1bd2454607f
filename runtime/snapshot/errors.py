"""Every error the snapshot agent raises: one tree under :class:`SnapshotError`.

Callers (the node agent, the sidecar, the CLI) catch ``SnapshotError`` and record
``str(exc)`` as the snapshot's failure reason, so every message names what failed and why.
The in-kernel code raises the same classes; the driver maps a remote error back to its class
by name (``ename``), so ``SnapshotIntegrityError`` means the same thing on both sides.
"""

from __future__ import annotations


class SnapshotError(Exception):
    """Base class: a snapshot could not be taken, read, restored or deleted."""


class SnapshotTimeout(SnapshotError):
    """The operation did not finish before its deadline (busy kernel, slow storage)."""


class KernelUnavailable(SnapshotError):
    """The kernel cannot be reached, died, or restarted while we were talking to it."""


class CaptureFailed(SnapshotError):
    """The capture ran in the kernel and raised; the message ends with the remote error."""


class RestoreFailed(SnapshotError):
    """The restore ran in the kernel and raised; the message ends with the remote error."""


class RestoreRefused(SnapshotError):
    """This kernel cannot take the snapshot as it is: its device arrays were on an
    accelerator this kernel lacks, or of another type. Decided before anything is read."""


class SnapshotIntegrityError(SnapshotError):
    """A stored object does not match the size or digest recorded at capture time, or a
    manifest does not match the sha256 the control plane recorded for it.

    Raised before anything is unpickled, so the target namespace is left untouched.
    """


class ManifestError(SnapshotError):
    """A manifest or kernel entry is malformed, of an unknown format, or inconsistent."""


class StorageError(SnapshotError):
    """Cloud Storage refused a request (permissions, missing bucket, bad request)."""


class ObjectNotFound(StorageError):
    """An object that a manifest or entry names is not in the bucket."""


class TransientStorageError(StorageError):
    """A storage request failed in a way that is worth retrying (5xx, 429, reset)."""
