"""The kernel-state snapshot agent: pause with live kernels, resume into them.

It captures a live Jupyter kernel's user namespace (variables, notebook functions and
classes, large numpy arrays) to Cloud Storage and restores it into a new kernel, without
re-running anything. The node agent calls it on this host; the Kubernetes sidecar calls
it on clusters without Pod Snapshots.

Modules, each owning one thing:

- ``kernels``   the driver, outside the kernel: :func:`snapshot_kernel`,
  :func:`restore_kernel` over the Jupyter kernel protocol.
- ``inkernel``  what runs inside the kernel: ``capture``/``restore`` of a namespace dict.
- ``pickling``  namespace to bytes and back (cloudpickle, protocol 5, out-of-band buffers).
- ``devices``   torch tensors and JAX arrays, on CPU or an accelerator, as segments; the
  accelerator rules of a restore.
- ``transfer``  parallel part upload/download with a BLAKE3 digest per part, device
  memory staged through bounded host buffers.
- ``staging``   a restore downloaded by the driver while the kernel starts, into
  shared-memory files the kernel maps (:func:`kernels.stage_kernel`).
- ``layout``    object names, the content-addressed part pool, and how the byte stream is
  cut into parts (pure).
- ``manifest``  the workspace manifest, written last: :func:`write_manifest`,
  :func:`read_manifest`, :func:`delete_prefix`, :func:`manifest_sha256`,
  :func:`manifest_parts`, :func:`reusable_parts`.
- ``storage``   the only module that talks to Cloud Storage.
- ``errors``    :class:`SnapshotError` and its subclasses.

Names are exported lazily, so that the kernel importing ``runtime.snapshot.inkernel`` does
not import the driver's dependencies.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from .errors import (
        CaptureFailed,
        KernelUnavailable,
        ManifestError,
        ObjectNotFound,
        RestoreFailed,
        RestoreRefused,
        SnapshotError,
        SnapshotIntegrityError,
        SnapshotTimeout,
        StorageError,
        TransientStorageError,
    )
    from .kernels import restore_kernel, snapshot_kernel
    from .layout import FORMAT
    from .manifest import (
        delete_prefix,
        manifest_parts,
        manifest_sha256,
        read_manifest,
        reusable_parts,
        write_manifest,
    )

_EXPORTS = {
    "snapshot_kernel": "kernels",
    "restore_kernel": "kernels",
    "write_manifest": "manifest",
    "read_manifest": "manifest",
    "delete_prefix": "manifest",
    "manifest_sha256": "manifest",
    "manifest_parts": "manifest",
    "reusable_parts": "manifest",
    "FORMAT": "layout",
    "SnapshotError": "errors",
    "SnapshotTimeout": "errors",
    "KernelUnavailable": "errors",
    "CaptureFailed": "errors",
    "RestoreFailed": "errors",
    "RestoreRefused": "errors",
    "SnapshotIntegrityError": "errors",
    "ManifestError": "errors",
    "StorageError": "errors",
    "ObjectNotFound": "errors",
    "TransientStorageError": "errors",
}

__all__ = [
    "FORMAT",
    "CaptureFailed",
    "KernelUnavailable",
    "ManifestError",
    "ObjectNotFound",
    "RestoreFailed",
    "RestoreRefused",
    "SnapshotError",
    "SnapshotIntegrityError",
    "SnapshotTimeout",
    "StorageError",
    "TransientStorageError",
    "delete_prefix",
    "manifest_parts",
    "manifest_sha256",
    "read_manifest",
    "restore_kernel",
    "reusable_parts",
    "snapshot_kernel",
    "write_manifest",
]


def __getattr__(name: str) -> Any:
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(importlib.import_module(f".{module}", __name__), name)
