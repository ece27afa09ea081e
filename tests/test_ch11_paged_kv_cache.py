"""Chapter 11 (a paged KV cache): the reference scores full marks and the stub zero; a
queue for a stack, a block taken at every token and stale slots read are each caught
with the words that name them; paged attention is chapter 4's contiguous cached
attention; the lesson's worked example is the reference's."""

import importlib.util
import math
import re

import pytest
import torch
import torch.nn.functional as F

from conftest import Draw, replace_function, result_of, solution_source, statuses, stub_source
from grader.catalog import COURSE_ROOT, find_chapter

CH11 = find_chapter("ch11")
SOLUTION = solution_source(CH11)
LESSON = COURSE_ROOT / "chapters" / CH11.folder


def _reference():
    spec = importlib.util.spec_from_file_location("reference_ch11_for_tests", CH11.solution())
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


# -- what the whole-course tests take from this chapter (tests/conftest.py's chapter_tests) --


def _cache(draw: Draw, seq_lens, block_size, num_blocks, heads, dim, dim_v, room):
    """A ragged paged cache: stale numbers everywhere, shuffled blocks, tables padded with 0."""
    k_pages, v_pages = draw.randn(num_blocks, block_size, heads, dim), draw.randn(num_blocks, block_size, heads, dim_v)
    ids = torch.randperm(num_blocks, generator=draw.generator).tolist()
    tables = torch.zeros(len(seq_lens), room, dtype=torch.int64)
    for b, length in enumerate(seq_lens):
        count = -(-length // block_size)
        tables[b, :count] = torch.tensor(ids[:count], dtype=torch.int64)
        ids = ids[count:]
    return k_pages, v_pages, tables, torch.tensor(seq_lens), torch.tensor(ids, dtype=torch.int64)


def samples(draw: Draw) -> list:
    """Calls of every exercise, ``[(exercise name, args, kwargs), ...]``, made on the
    reference and on each correct style (tests/test_correct_styles.py)."""
    free = torch.randperm(7, generator=draw.generator)
    k_pages, v_pages, tables, lengths, left = _cache(draw, [5, 0, 3, 8], 4, 12, 2, 3, 2, 3)
    new = (draw.randn(4, 2, 3), draw.randn(4, 2, 2))
    ones = _cache(draw, [2, 1, 3], 1, 9, 1, 2, 2, 4)
    q = draw.randn(4, 2, 3)
    return [
        ("allocate_blocks", (free, 3), {}),
        ("allocate_blocks", (free, 0), {}),
        ("allocate_blocks", (free, 7), {}),
        ("append_to_pages", (k_pages, v_pages, tables, lengths, *new, left), {}),
        ("append_to_pages", (*ones[:4], draw.randn(3, 1, 2), draw.randn(3, 1, 2), ones[4]), {}),
        ("paged_attention", (q, k_pages, v_pages, tables, lengths.clamp(min=1)), {}),
        ("paged_attention", (draw.randn(3, 1, 2, dtype=torch.float64), ones[0].double(), ones[1].double(),
                             ones[2], ones[3]), {}),
    ]


# A known bug of grader/chapters/ch11/bugs.py that tests/test_release.py makes in both trees.
RELEASE_BUG = ("paged_attention", "no-length-mask")


# -- grades ----------------------------------------------------------------------------------


def test_solution_scores_full_marks_and_stub_scores_zero(grade_source):
    solved = grade_source(SOLUTION, chapter="ch11")
    assert solved.passed and solved.score == solved.max_score == 8
    stub = grade_source(stub_source(CH11), chapter="ch11")
    assert stub.score == 0
    assert set(statuses(stub).values()) == {"not implemented"}


# A queue (vLLM v1's free queue pops from the front) where the chapter's free list is a stack.
AS_A_QUEUE = '''
def allocate_blocks(free_blocks, count):
    if count > len(free_blocks):
        raise RuntimeError("out of blocks")
    return free_blocks[:count], free_blocks[count:]
'''

# A block for every token, the mistake of a cache that "grows" one token at a time.
BLOCK_EVERY_TOKEN = '''
def append_to_pages(k_pages, v_pages, block_tables, seq_lens, k_new, v_new, free_blocks):
    block_size = k_pages.shape[1]
    k_pages, v_pages, block_tables = k_pages.clone(), v_pages.clone(), block_tables.clone()
    blocks, free_blocks = allocate_blocks(free_blocks, len(seq_lens))
    for b in range(len(seq_lens)):
        position = int(seq_lens[b])
        block_tables[b, position // block_size] = blocks[b]
        k_pages[blocks[b], position % block_size] = k_new[b]
        v_pages[blocks[b], position % block_size] = v_new[b]
    return k_pages, v_pages, block_tables, seq_lens + 1, free_blocks
'''

# Every slot of every block in the table attended to, stale ones included.
NO_MASK = '''
def paged_attention(q, k_pages, v_pages, block_tables, seq_lens):
    batch = q.shape[0]
    k = k_pages[block_tables].flatten(1, 2).transpose(1, 2)
    v = v_pages[block_tables].flatten(1, 2).transpose(1, 2)
    return F.scaled_dot_product_attention(q[:, :, None], k, v).squeeze(2)
'''


@pytest.mark.parametrize("exercise, definition, words", [
    ("allocate_blocks", AS_A_QUEUE, "a stack"),
    ("append_to_pages", BLOCK_EVERY_TOKEN, "only when its last block is full"),
    ("paged_attention", NO_MASK, "stale"),
], ids=["queue", "block-every-token", "no-mask"])
def test_a_common_mistake_fails_alone_with_its_hint(grade_source, exercise, definition, words):
    source = replace_function(SOLUTION, exercise, definition)
    if exercise == "paged_attention":
        source = source.replace("import torch\n", "import torch\nimport torch.nn.functional as F\n", 1)
    report = grade_source(source, chapter="ch11")
    failed = {name for name, status in statuses(report).items() if status != "passed"}
    assert exercise in failed
    assert failed <= {exercise, "append_to_pages"}  # append_to_pages builds on allocate_blocks
    hints = [check.hint or "" for check in result_of(report, exercise).failed_checks]
    assert any(words in hint for hint in hints), hints


def test_moving_a_token_is_named_by_its_slot(grade_source):
    """A token written over the last cached one is found by the slot it changed."""
    source = SOLUTION.replace("positions = seq_lens  #", "positions = seq_lens - 1  #")
    report = grade_source(source, chapter="ch11")
    messages = [check.message for check in result_of(report, "append_to_pages").failed_checks]
    assert any(re.search(r"changed slot \d+ of block \d+, which holds token \d+ of sequence \d+", message)
               for message in messages), messages


# -- the reference is chapter 4's contiguous cache -----------------------------------------------


def test_paged_attention_is_contiguous_cached_attention():
    """Decoding token by token through the pages gives what attention over the contiguous
    cache (chapter 4's torch.cat) gives, whatever the blocks' physical order."""
    reference = _reference()
    torch.manual_seed(11)
    block_size, heads, dim = 3, 2, 4
    k_pages, v_pages = torch.randn(10, block_size, heads, dim), torch.randn(10, block_size, heads, dim)
    tables = torch.zeros(2, 4, dtype=torch.int64)
    lengths = torch.zeros(2, dtype=torch.int64)
    free = torch.randperm(10)
    contiguous_k, contiguous_v = torch.empty(2, heads, 0, dim), torch.empty(2, heads, 0, dim)
    for _ in range(9):
        k_new, v_new, q = torch.randn(2, heads, dim), torch.randn(2, heads, dim), torch.randn(2, heads, dim)
        k_pages, v_pages, tables, lengths, free = reference.append_to_pages(
            k_pages, v_pages, tables, lengths, k_new, v_new, free)
        contiguous_k = torch.cat([contiguous_k, k_new[:, :, None]], dim=2)  # (B, H, T, d)
        contiguous_v = torch.cat([contiguous_v, v_new[:, :, None]], dim=2)
        expected = F.scaled_dot_product_attention(q[:, :, None], contiguous_k, contiguous_v)[:, :, 0]
        torch.testing.assert_close(reference.paged_attention(q, k_pages, v_pages, tables, lengths), expected)
    assert len(free) == 10 - 2 * 3  # 9 tokens of block size 3: three blocks a sequence


# -- the lesson's worked example -------------------------------------------------------------


def _example():
    """The lesson's two sequences: A in blocks [5, 2] (3 tokens), B in block [7] (2 tokens),
    block size 2, one head of width 2, every stale slot holding 9."""
    k_pages, v_pages = torch.full((8, 2, 1, 2), 9.0), torch.full((8, 2, 1, 2), 9.0)
    tokens = {(5, 0): ([2, 0], [2, 0]), (5, 1): ([0, 2], [0, 2]), (2, 0): ([1, 1], [0, 0]),
              (7, 0): ([1, 0], [1, 0]), (7, 1): ([0, 1], [0, 1])}
    for (page, slot), (key, value) in tokens.items():
        k_pages[page, slot, 0], v_pages[page, slot, 0] = torch.tensor(key, dtype=torch.float), torch.tensor(
            value, dtype=torch.float)
    tables, lengths = torch.tensor([[5, 2, 0], [7, 0, 0]]), torch.tensor([3, 2])
    new_k, new_v = torch.tensor([[[0.0, 0.0]], [[1.0, 1.0]]]), torch.tensor([[[1.0, 1.0]], [[2.0, 2.0]]])
    return k_pages, v_pages, tables, lengths, new_k, new_v, torch.tensor([0, 3, 1, 6, 4])


def test_the_lessons_worked_example_is_the_references():
    reference = _reference()
    lesson = (LESSON / "README.md").read_text(encoding="utf-8")
    text = " ".join(lesson.split())
    k_pages, v_pages, tables, lengths, free = (*_example()[:4], _example()[6])
    assert [t.tolist() for t in reference.allocate_blocks(free, 2)] == [[4, 6], [0, 3, 1]]
    assert "`allocate_blocks(free, 2)` returns `([4, 6], [0, 3, 1])`" in text
    k_pages, v_pages, tables, lengths, free = reference.append_to_pages(*_example())
    assert tables.tolist() == [[5, 2, 0], [7, 4, 0]] and lengths.tolist() == [4, 3]
    assert free.tolist() == [0, 3, 1, 6]
    for words in ("block tables `[[5, 2, 0], [7, 4, 0]]`", "`seq_lens` `[4, 3]`", "free stack `[0, 3, 1, 6]`"):
        assert words in text, words
    q = torch.tensor([[[1.0, 1.0]], [[1.0, 1.0]]])
    output = reference.paged_attention(q, k_pages, v_pages, tables, lengths)
    scores = torch.tensor([1.0, 1.0, 2.0]) / math.sqrt(2)
    weights = torch.softmax(scores, dim=0)
    assert f"{weights[0]:.4f}, {weights[1]:.4f}, {weights[2]:.4f}" in text
    assert f"[{output[1, 0, 0]:.4f}, {output[1, 0, 1]:.4f}]" in text
    stale = reference.paged_attention(q, k_pages, v_pages, tables, lengths + 1)
    assert f"{stale[1, 0, 0]:.4f}" in text
    freed = torch.cat([free, torch.tensor([7, 4])])
    assert [t.tolist() for t in reference.allocate_blocks(freed, 1)] == [[4], [0, 3, 1, 6, 7]]
    assert "free stack `[0, 3, 1, 6, 7, 4]`" in text
