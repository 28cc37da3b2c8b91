"""Pure decisions of this package: no I/O, no clock (time is an argument), mypy --strict."""
