"""The repository's own checks on its three translations, read from their source (nothing is
imported): ``mirror`` compares the backends statement by statement once each framework's
spelling is normalised (``transformer-ref mirror``), ``differences`` holds the reason for every
difference that remains, and ``shape_comments`` finds tensor lines without a shape comment.

Standard library only (and ``transformer_spec``'s backend names): these read the backends'
files, they do not run them.
"""

from .differences import NUMPY_BACKWARD, ONE_BACKEND_FILES, PER_BACKEND_FILES, REASONS
from .mirror import PAIRS, Difference, Report, mirror_report, normalise
from .shape_comments import COMPONENT_FILES, missing_shape_comments, tensor_lines

__all__ = [
    "COMPONENT_FILES",
    "NUMPY_BACKWARD",
    "ONE_BACKEND_FILES",
    "PAIRS",
    "PER_BACKEND_FILES",
    "REASONS",
    "Difference",
    "Report",
    "missing_shape_comments",
    "mirror_report",
    "normalise",
    "tensor_lines",
]
