"""What runs in a Kubernetes cluster next to the workspaces.

- ``monitor``        the cluster monitor: watches workspace pods, Pod Snapshot triggers and
                     PodSnapshots and publishes workspace.ready, snapshot.finished,
                     workspace.idle_detected and workspace.runtime_failed (one Deployment
                     per cluster, ``functions.kubernetes.objects.monitor``), with its
                     watchers ``sandbox_watch`` (sandbox.finished, .suspended,
                     .idle_detected) and ``job_watch`` (job.finished);
- ``cluster``        the monitor's read-only view of the cluster (the official client);
- ``sidecar``        the snapshot agent in every workspace pod: activity for the idle
                     policy, and with method ``kernel`` the local runtime's kernel snapshots
                     (``runtime.snapshot``), driven by the monitor;
- ``job_host``       the command of every pod of a scale-out job's JobSet.

These processes import, of the control plane, only the object builders and readings
(``functions.kubernetes.objects``) and ``events`` (an import-linter contract keeps it so):
the control plane's side (``functions.kubernetes``: the runtimes and ``api``) and these
agree on every object through the builders alone. ``Dockerfile.agent`` builds the one image
the monitor, the sidecar and the job hosts' init container run.
"""
