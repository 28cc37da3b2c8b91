"""Facts every pure decision shares (numeric tolerance, units of time): declared once here.

Like every `core/` folder this package is pure: no I/O, no clock, mypy --strict.
"""
