"""The local runtime: a node agent that runs each workspace as a real Jupyter server.

The agent is a small HTTP service on 127.0.0.1 (``python -m runtime.local.agent``). For
every workspace it supervises one JupyterLab server process in its own process group, with
a home directory of its own under ``<data_dir>/homes/<workspace_id>`` (the persistent
disk's stand-in), token auth, and the profile's memory and CPU limits. It snapshots the
live kernels of a workspace to Cloud Storage with the kernel-state agent of
``runtime.snapshot`` and restores them into a fresh server, and reports every outcome of
an asynchronous request as an event on Pub/Sub.

Modules, one responsibility each:

- ``settings``   where the agent keeps its files, how long it waits for things;
- ``host``       what this host offers (CPUs, memory, GPUs, IDEs), profile quantities, and
                 the admission rule that refuses a profile the host cannot run;
- ``launch``     the exec trampoline that applies the limits (and drops to the
                 workspace's own user) before Jupyter starts;
- ``tenancy``    one OS user per workspace: whether this agent can, which uid is whose;
- ``servers``    workspace servers: start one, wait until it answers, stop its whole tree,
                 recognise one that survived an agent restart (the process-group
                 mechanics are ``runtime.supervisor``'s, shared with the local stack);
- ``jupyter``    the REST client for one workspace's server (status, kernels, sessions);
- ``state``      the agent's state file (which servers run, which operation is in flight);
- ``publisher``  how events leave the agent (Pub/Sub, or a recorder in tests);
- ``snapshots``  the snapshot and restore orchestration across a workspace's kernels;
- ``node``       ``NodeAgent``: the operations, their background threads, crash recovery;
- ``agent``      the thin HTTP layer (``create_app``) and the command-line entry point.

Nothing is imported here, so ``python -m runtime.local.launch`` starts fast.
"""
