"""Data, not tests (conftest.py says what). A package so that its conftest.py
is imported as ``new_chapter.conftest``, not as a second ``conftest`` that
would hide tests/conftest.py from the tests that import it."""
