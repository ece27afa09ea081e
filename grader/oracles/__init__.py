"""Independent answers: what the checks compare with besides the reference.

One module a chapter, ``grader/oracles/chNN.py``, written from PyTorch's own
functions and from other people's code (Meta's complex RoPE, Hugging Face's
``rotate_half``, a loop over heads), never from the course's solutions, so
that a mistake shared by the reference and a student cannot hide.
``common.py`` holds what several chapters use.

An oracle computes an exercise's answer, so the student edition holds none
of this package: checks reach the oracles through ``grader.checks.Oracles``,
which answers from the recordings there, as the reference does
(``grader.recorded``).
"""
