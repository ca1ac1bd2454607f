"""The `stasis` command line: the local stack, workspaces, links, sandboxes, jobs, chat,
upkeep, dead letters and the admin file, one module per group of verbs.

``main`` assembles the verbs, ``options`` holds what they share (``--as``, ``--json``,
``--wait``, the stack's settings, the acting user), ``client`` is what the verbs read
(Firestore, the node agent) and how a request is followed to its outcome, ``link_client``
an agent's side of a link (``stasis exec``), ``deadletters`` the reader of the dead-letter
topics. The CLI drives the control plane only through events, HTTP functions and reads;
``stack`` is the local deployment it starts and stops. Nothing under ``functions``,
``runtime`` or ``stack`` imports this package.
"""
