"""Developer tools that are not part of the installed packages (``python -m tools.mutants``)."""
