"""The generated three-column reference site: ``python -m docs.build`` (see build.py), run by ``nox -s docs``."""
