from .processes import sharded_runs  # noqa: F401  (the fixture, for both sharded test files)
