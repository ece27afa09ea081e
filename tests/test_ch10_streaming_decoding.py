"""Chapter 10's checks: full marks for correct code, zero for the stubs, and
the pitfalls of streaming decoding caught with words a student can act on:
a window off by one names the keys a row sees, a ring that overwrites the
sinks lists the tokens the slots hold, text positions in place of positions
within the cache are named, and a step whose memory grows with the tokens
decoded fails the kernel's budget while its values pass. The lesson's
worked example is recomputed from the reference. (Each known bug of
grader/chapters/ch10/bugs.py is proved caught by test_known_bugs.py; the
wrong versions here are written differently.)"""

import importlib.util

import torch
from conftest import (
    Draw,
    replace_function,
    result_of,
    solution_source,
    statuses,
    stub_source,
)

from grader.catalog import COURSE_ROOT, find_chapter

CH10 = find_chapter("ch10")
SOLUTION = solution_source(CH10)
LESSON = (COURSE_ROOT / "chapters" / CH10.folder / "README.md").read_text(encoding="utf-8")
FLAT = " ".join(LESSON.split())  # the lesson's words, whatever its line breaks


def _reference():
    spec = importlib.util.spec_from_file_location("reference_ch10_for_tests", CH10.solution())
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _hints(result) -> list[str]:
    return [check.hint or "" for check in result.failed_checks]


def _failed(result) -> dict[str, str]:
    """Failed checks of an exercise: {title: message}."""
    return {check.check: check.message for check in result.failed_checks}


def test_the_solution_gets_full_marks(grade_source):
    report = grade_source(SOLUTION, chapter="ch10")
    assert report.passed, [(r.exercise.name, r.reason) for r in report.exercises]
    assert report.score == report.max_score == 8


def test_the_stubs_score_zero(grade_source):
    report = grade_source(stub_source(CH10), chapter="ch10")
    assert report.score == 0
    assert set(statuses(report).values()) == {"not implemented"}


# -- the lesson's worked example -------------------------------------------------------------


def _held_tokens(reference, length, capacity, sinks):
    """The token each slot holds after ``length`` tokens, read back from keys numbered t + 1."""
    k, v = torch.zeros(1, 1, capacity, 2), torch.zeros(1, 1, capacity, 2)
    for t in range(length):
        k, v = reference.rolling_cache_append(k, v, torch.full((1, 1, 1, 2), t + 1.0), v[:, :, :1], t, sinks)
    return [int(value) - 1 for value in k[0, 0, :, 0].tolist()]


def _grid(mask) -> str:
    return "\n".join(" ".join("1" if entry else "." for entry in row) for row in mask.tolist())


def test_the_lessons_worked_example_is_the_reference():
    reference = _reference()
    # Section 2: the sink-plus-window mask of 6 tokens, W = 3, one sink.
    assert _grid(reference.sliding_window_mask(6, 6, 3, 1)) in LESSON
    # Section 3: C = 6 slots, 2 sinks, a window of 4, after tokens 0..9 and 0..10.
    assert _held_tokens(reference, 10, 6, 2) == [0, 1, 6, 7, 8, 9]
    assert _held_tokens(reference, 11, 6, 2) == [0, 1, 10, 7, 8, 9]
    assert "[0, 1, 6, 7, 8, 9]" in LESSON and "[0, 1, 10, 7, 8, 9]" in LESSON
    row = reference.sliding_window_mask(11, 11, 4, 2)[10]
    assert row.nonzero().flatten().tolist() == [0, 1, 7, 8, 9, 10]
    assert "keys 0, 1, 7, 8, 9 and 10" in FLAT
    # Section 4: the positions within the cache at token 10, slot by slot.
    held = _held_tokens(reference, 11, 6, 2)
    order = sorted(range(6), key=lambda slot: held[slot])
    positions = [order.index(slot) for slot in range(6)]
    assert positions == [0, 1, 5, 2, 3, 4]
    assert "[0, 1, 5, 2, 3, 4]" in LESSON
    assert "the query at 5 (not at 10)" in FLAT and "text positions `[0, 1, 10, 7, 8, 9]`" in FLAT
    # StreamingLLM's own example: 4 sinks, tokens [0, 1, 2, 3, 6, 7, 8] held when token 9 comes.
    assert sorted(_held_tokens(reference, 10, 8, 4)) == [0, 1, 2, 3, 6, 7, 8, 9]
    assert "[0, 1, 2, 3, 6, 7, 8]" in LESSON


# -- what the checks say ---------------------------------------------------------------------


def test_a_window_that_counts_one_key_too_many_names_the_keys(grade_source):
    # "within W of the query" read as a distance <= W: W + 1 keys.
    source = replace_function(SOLUTION, "sliding_window_mask", '''
def sliding_window_mask(query_len, key_len, window, sinks=0, device=None):
    rows = torch.arange(key_len - query_len, key_len, device=device)[:, None]
    columns = torch.arange(key_len, device=device)[None, :]
    distance = rows - columns
    return (distance >= 0) & ((distance <= window) | (columns < sinks))
''')
    result = result_of(grade_source(source, chapter="ch10", only={"sliding_window_mask"}), "sliding_window_mask")
    assert result.status == "failed"
    assert any("W + 1 keys" in hint for hint in _hints(result))
    assert "row 3 lets query 3 see keys [0, 1, 2, 3], expected keys [1, 2, 3]" in " ".join(_failed(result).values())


def test_a_ring_over_the_whole_buffer_lists_the_tokens_held(grade_source):
    # Mistral's i % W, with the sinks inside the ring: they are overwritten.
    source = SOLUTION.replace(
        "slot = count if count < sinks else sinks + (count - sinks) % (capacity - sinks)",
        "slot = count % capacity  # Mistral's rolling buffer")
    assert source != SOLUTION
    report = grade_source(source, chapter="ch10", only={"rolling_cache_append"})
    result = result_of(report, "rolling_cache_append")
    assert result.status == "failed"
    assert any("sinks are evicted" in hint for hint in _hints(result))
    messages = _failed(result)
    eviction = [message for title, message in messages.items() if title.startswith("appending 16 tokens")]
    assert eviction and "its slots hold tokens [6, 1, 2, 3, 4, 5], expected [0, 1, 6, 3, 4, 5]" in eviction[0]


def test_text_positions_written_differently_are_named(grade_source):
    # RoPE at the tokens' places in the text (the Llama habit, start_pos + i).
    source = SOLUTION.replace(
        "positions = torch.where(slot < sinks, slot, token - evicted)  # (C,)",
        "positions = token  # (C,)").replace(
        "query_at = torch.tensor([count - evicted], device=x_new.device)  # (1,)",
        "query_at = torch.tensor([count], device=x_new.device)  # (1,)")
    assert source.count("positions = token  #") == 1 and "[count], device" in source
    report = grade_source(source, chapter="ch10", only={"streaming_attention_step"})
    result = result_of(report, "streaming_attention_step")
    assert result.status == "failed"
    assert result.reason.startswith("looks like the keys and the query are rotated by their positions in the text")
    failed = _failed(result)
    # Without RoPE positions play no part: those checks pass.
    assert not any(title.startswith("without RoPE") for title in failed)


def test_memory_that_grows_with_the_tokens_decoded_fails_the_budget(grade_source):
    # Right values, from a tensor as long as the text: the kernel's budget refuses it.
    source = SOLUTION.replace(
        "    held = slot <= count  # (C,): the slots written so far, this step's included\n",
        "    text = torch.arange(count + 1, device=x_new.device)  # every token so far\n"
        "    held = slot < len(text)\n")
    assert source != SOLUTION
    report = grade_source(source, chapter="ch10", only={"streaming_attention_step"})
    result = result_of(report, "streaming_attention_step")
    assert result.status == "failed"
    failed = _failed(result)
    assert list(failed) == [("a step at token 10^9 + 7 with an 8-slot buffer needs no more than 16 MiB, as the "
                             "kernel counts it: nothing grows with the tokens decoded")], failed


def test_a_buffer_that_grows_is_told_it_never_grows(grade_source):
    # Chapter 4's habit: append with torch.cat. The values of one step can be right,
    # but the returned buffer is one slot longer each time.
    source = replace_function(SOLUTION, "rolling_cache_append", '''
def rolling_cache_append(k_cache, v_cache, k_new, v_new, count, sinks=0):
    return torch.cat([k_cache, k_new], dim=2), torch.cat([v_cache, v_new], dim=2)
''')
    report = grade_source(source, chapter="ch10", only={"rolling_cache_append"})
    result = result_of(report, "rolling_cache_append")
    assert result.status == "failed"
    messages = " ".join(_failed(result).values())
    assert "(it never grows)" in messages and "has shape (1, 2, 7, 3), expected (1, 2, 6, 3)" in messages


# -- what the whole-course tests take from this chapter (tests/conftest.py's chapter_tests) --


def samples(draw: Draw) -> list:
    """Calls of every exercise, ``[(exercise name, args, kwargs), ...]``, made on the
    reference and on each correct style (tests/test_correct_styles.py)."""
    weights = (draw.weights(8, 8), draw.weights(8, 8), draw.weights(6, 8), draw.weights(5, 6))
    k_cache, v_cache = draw.randn(2, 2, 6, 4), draw.randn(2, 2, 6, 3)
    k_new, v_new = draw.randn(2, 2, 1, 4), draw.randn(2, 2, 1, 3)
    x_new = draw.randn(2, 1, 8)
    calls = [
        ("sliding_window_mask", (7, 7, 3), {}),
        ("sliding_window_mask", (7, 7, 3, 2), {}),
        ("sliding_window_mask", (3, 9, 2), {"sinks": 1}),
        ("sliding_window_mask", (6, 3, 10, 0), {}),
    ]
    for count, sinks in ((0, 2), (4, 2), (6, 2), (23, 2), (11, 0), (10**9 + 7, 5)):
        calls.append(("rolling_cache_append", (k_cache, v_cache, k_new, v_new, count, sinks), {}))
    for count, sinks, theta in ((0, 2, 10000.0), (3, 2, 10000.0), (5, 1, 100.0), (17, 2, 10000.0),
                                (17, 2, None), (12, 0, 500.0), (10**9 + 7, 3, 10000.0)):
        calls.append(("streaming_attention_step", (x_new, 2, *weights, k_cache, v_cache, count),
                      {"sinks": sinks, "theta": theta}))
    return calls


# A known bug of grader/chapters/ch10/bugs.py that tests/test_release.py makes in both trees.
RELEASE_BUG = ("rolling_cache_append", "sinks-evicted")
