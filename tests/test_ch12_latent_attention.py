"""Chapter 12's own tests: TODO: what its checks say where the
whole-course tests (test_course.py, test_known_bugs.py) do not look."""

from conftest import Draw

# -- what the whole-course tests take from this chapter (tests/conftest.py's chapter_tests) --


def samples(draw: Draw) -> list:
    """Calls of every exercise, ``[(exercise name, args, kwargs), ...]``, made on the
    reference and on each correct style (tests/test_correct_styles.py)."""
    return [
        ("MultiHeadLatentAttention", (draw.randn(2, 3, 4),), {}),  # TODO: calls that cover its contract
        ("absorbed_decode", (draw.randn(2, 3, 4),), {}),  # TODO: calls that cover its contract
        ("latent_cache_bytes", (draw.randn(2, 3, 4),), {}),  # TODO: calls that cover its contract
    ]


# A known bug of grader/chapters/ch12/bugs.py that tests/test_release.py makes in both trees.
RELEASE_BUG = ("MultiHeadLatentAttention", "todo-multiheadlatentattention-doubled")
