"""Deploy tooling: what `stasis bundle` builds for Google Cloud from the code's own tables.

- ``bundle.py``: the Cloud Functions source zip (functions/, events/, schemas/, pinned
  requirements, a root ``main.py``);
- ``tfvars.py``: Terraform's generated inputs (``stasis.auto.tfvars.json``): every function
  of ``functions/routes.py`` with its trigger, exposure, schedule, service account and
  dead-letter topic, the topics of ``events/``, the Firestore indexes and the cluster objects;
- ``indexes.py``: the composite indexes, from the queries the stores declare;
- ``cluster.py``: the cluster objects, from the Kubernetes builders;
- ``cli.py``: the ``stasis bundle`` command.

Nothing here is deployed or imported by ``functions`` or ``runtime`` (import-linter).
"""
