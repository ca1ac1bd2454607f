"""What runs next to the workspaces, not in the control plane.

- ``runtime.local``: the node agent that supervises real Jupyter servers on this host.
- ``runtime.snapshot``: the kernel-state snapshot agent (capture a live kernel's user
  namespace to Cloud Storage, restore it into a new kernel), shared by the node agent and
  the Kubernetes sidecar.
- ``runtime.supervisor``: the one process-group supervisor on a host (a session of its own,
  identity by creation time, readiness polling, TERM then KILL of the group, log tails,
  atomic JSON records), used by the node agent and by the local stack (``stack``).

Code here may do I/O and import SDKs (jupyter_client, google-cloud-storage); the control
plane talks to it only through the runtime port.
"""
