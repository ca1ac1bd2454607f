"""What drives a running stack from the outside, as a user would: for the demo, the tests and
the benchmarks. Nothing deployed imports it (import-linter's layers contract).

- ``notebook``: a workspace's JupyterLab driven as a browser drives it (REST for sessions,
  the kernel websocket for code), with only its URL and token;
- ``metering``: the Firestore reads and writes one client makes, counted at the RPC level;
- ``demo``: ``make demo``, the main job told end to end (create, build state, pause, resume,
  the state intact).
"""
