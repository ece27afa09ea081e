"""tests/new_chapter/ holds, at the paths they take in the course, the
files of a small but complete chapter 13 (sliding-window attention, one
exercise): the data of tests/test_scaffold.py's acceptance test, which
copies them over a skeleton written by ``mha-course new-chapter`` in a copy
of the course. Here they are data: pytest collects none of them.
"""

collect_ignore = ["chapters", "grader", "solutions", "tests"]
