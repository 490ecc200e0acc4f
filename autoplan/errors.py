"""The one exception type users see.

A SpecError carries a single line that names the file or option, the field and the fix. The CLI prints
it and exits with status 2; every other exception is a bug and keeps its traceback.
"""


class SpecError(ValueError):
    """Bad user input: a missing file, an unknown key, an impossible value, a plan that cannot fit."""
