"""Kubernetes in one place: the objects Stasis makes, the API that applies them, and the
runtimes that decide what to apply.

- ``objects/``      pure builders and readings (dicts in, dicts out; no SDK, no I/O);
- ``api``           the official ``kubernetes`` client: apply, read, patch, delete, list
                    objects given as dicts, with the Runtime port's errors;
- ``workspaces``    the Runtime port on a cluster (``KubernetesRuntime``);
- ``sandboxes``     the SandboxRuntime port on a cluster (git bundle, signed URLs, Pod);
- ``jobs``          the JobRuntime port on a cluster (one JobSet per job).

Layers, checked by import-linter: the runtimes above ``api`` above ``objects``; ``objects``
imports no SDK. What runs *in* the cluster (the monitor and its watchers, the snapshot agent
sidecar, a job's hosts) lives in ``runtime/kubernetes`` and imports only ``objects`` and
``events`` from here. Importing this package costs nothing: ``bootstrap`` imports a runtime
only when ``STASIS_RUNTIME=kubernetes``, and the client is imported on the first API call.
"""
