"""What runs in a Kubernetes cluster next to the workspaces.

- ``monitor``  the cluster monitor: watches workspace pods, Pod Snapshot triggers and
               PodSnapshots and publishes workspace.ready, snapshot.finished,
               workspace.idle_detected and workspace.runtime_failed (one Deployment per
               cluster, ``functions.domain.manifests.monitor_manifests``);
- ``sidecar``  the snapshot agent in every workspace pod: activity for the idle policy,
               and with method ``kernel`` the local runtime's kernel snapshots
               (``runtime.snapshot``), driven by the monitor.

The control plane's side is ``functions.adapters.kubernetes_runtime``; the objects both
sides agree on come from ``functions.domain.manifests``. ``Dockerfile.agent`` builds the
one image both processes run.
"""
