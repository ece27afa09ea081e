"""Chapter 9's own tests: TODO: what its checks say where the
whole-course tests (test_course.py, test_known_bugs.py) do not look."""

from conftest import Draw

# -- what the whole-course tests take from this chapter (tests/conftest.py's chapter_tests) --


def samples(draw: Draw) -> list:
    """Calls of every exercise, ``[(exercise name, args, kwargs), ...]``, made on the
    reference and on each correct style (tests/test_correct_styles.py)."""
    return [
        ("flash_attention_forward", (draw.randn(2, 3, 4),), {}),  # TODO: calls that cover its contract
        ("flash_attention_backward", (draw.randn(2, 3, 4),), {}),  # TODO: calls that cover its contract
        ("FlashAttentionFunction", (draw.randn(2, 3, 4),), {}),  # TODO: calls that cover its contract
    ]


# A known bug of grader/chapters/ch09/bugs.py that tests/test_release.py makes in both trees.
RELEASE_BUG = ("flash_attention_forward", "todo-flash-attention-forward-doubled")
