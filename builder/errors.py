"""The builder's one error type for problems the user can fix (bad input, bad target)."""


class BuildError(Exception):
    pass
