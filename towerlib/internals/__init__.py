"""The TensorFlow internals towerlib relies on, one small module each.

Everything here reaches past TensorFlow's public API: a private method, a
`tensorflow.python` import, a private attribute, an error message text or a
temporary file name. Each lives in exactly one module, behind a function whose
docstring says what it relies on, and `tests/internals/` fail with a
clear message when a TensorFlow release removes it. Nothing else in towerlib
touches these internals directly.
"""
