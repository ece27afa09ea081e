"""Every known bug is taught: the lesson of its chapter warns about it.

A pitfall in a lesson's "Pitfalls" section names the known bugs it warns
about in a comment that a reader of the rendered lesson does not see:

    - **Scaling by `sqrt(D)`** instead of `sqrt(d_k)`, ...
      <!-- known bugs: scale-by-model-dim, no-scale -->

A name stands for every exercise's bug of that name in the chapter. The
grader shows a student the bug's hint, never its name; the names are the
catalog's, so that this test can hold the lesson and the catalog together.
"""

import re

import pytest
import torch

from grader.known_bugs import KNOWN_BUGS
from grader.catalog import CHAPTERS, COURSE_ROOT
from grader.lesson_checks import BEGIN, END, RECIPE

TAG = re.compile(r"<!--\s*known bugs:(.*?)-->", flags=re.DOTALL)

# Known bugs that no pitfall needs to name, each with why. Empty: every bug
# of the catalog is a mistake worth a warning.
TAUGHT_ELSEWHERE: dict[tuple[str, str], str] = {}


def _pitfalls(chapter) -> str:
    """The text of the lesson's "## N. Pitfalls" section, up to the next section."""
    lesson = chapter.lesson().read_text(encoding="utf-8")
    found = re.search(r"^## \d+\. Pitfalls\n(.*?)(?=^## )", lesson, flags=re.MULTILINE | re.DOTALL)
    assert found is not None, f"{chapter.folder}/README.md has no Pitfalls section"
    return found.group(1)


def _tagged(chapter) -> list[str]:
    return [name.strip() for tag in TAG.findall(_pitfalls(chapter)) for name in tag.split(",") if name.strip()]


@pytest.mark.parametrize("chapter", CHAPTERS, ids=[chapter.id for chapter in CHAPTERS])
def test_every_known_bug_is_named_by_a_pitfall_of_its_lesson(chapter):
    taught = set(_tagged(chapter))
    untaught = sorted(
        f"{bug.exercise}/{bug.name}"
        for bug in KNOWN_BUGS[chapter.id]
        if bug.name not in taught and (chapter.id, bug.name) not in TAUGHT_ELSEWHERE
    )
    assert not untaught, f"{chapter.folder}/README.md: no pitfall names {', '.join(untaught)}"


@pytest.mark.parametrize("chapter", CHAPTERS, ids=[chapter.id for chapter in CHAPTERS])
def test_a_pitfall_names_only_bugs_of_the_catalog_and_each_once(chapter):
    names = {bug.name for bug in KNOWN_BUGS[chapter.id]}
    tagged = _tagged(chapter)
    assert sorted(set(tagged) - names) == [], "stale names in the lesson's pitfalls"
    assert sorted({name for name in tagged if tagged.count(name) > 1}) == [], "a bug named by two pitfalls"
    assert not {name for (chapter_id, name) in TAUGHT_ELSEWHERE if chapter_id == chapter.id} & set(tagged)


def test_the_comments_are_hidden_from_a_reader():
    # A tag that a Markdown renderer would show (an unclosed comment) would
    # swallow the rest of the lesson: every "<!--" is closed before the next.
    for chapter in CHAPTERS:
        text = _pitfalls(chapter)
        assert text.count("<!--") == text.count("-->"), chapter.folder


# -- what the checks try, in the grading section ---------------------------------------------


def _grading_section(lesson: str) -> str | None:
    """The lesson's "## N. The exercises and how they are graded", up to the next section."""
    found = re.search(r"^## \d+\. The exercises and how they are graded\n(.*?)(?=^## |\Z)", lesson,
                      flags=re.MULTILINE | re.DOTALL)
    return found.group(1) if found else None


def _list_of_checks_problem(chapter, lesson: str) -> str | None:
    """What is wrong with the lesson's markers of the list of checks, in a
    line that names the chapter; None when nothing is."""
    where = f"{chapter.id}: chapters/{chapter.folder}/README.md"
    section = _grading_section(lesson)
    if section is None:
        return f"{where} has no section \"The exercises and how they are graded\"; {RECIPE}"
    lines = [line.strip() for line in section.splitlines()]
    if not (lines.count(BEGIN) == 1 and lines.count(END) == 1 and lines.index(BEGIN) < lines.index(END)):
        return f"{where}: its grading section needs the line {BEGIN} and, below it, the line {END}; {RECIPE}"
    if lesson.count(BEGIN) != 1 or lesson.count(END) != 1:
        return f"{where}: a marker of the list of checks outside its grading section; {RECIPE}"
    listed = [line for line in lines[lines.index(BEGIN):lines.index(END)] if line.startswith("<summary>")]
    if listed != [f"<summary><code>{exercise.name}</code></summary>" for exercise in chapter.exercises]:
        return f"{where}: its list of checks is not the build's: run `mha-course build`"
    return None


@pytest.mark.parametrize("chapter", CHAPTERS, ids=[chapter.id for chapter in CHAPTERS])
def test_the_grading_section_holds_the_list_of_checks_between_its_markers(chapter):
    """``mha-course build`` writes what each exercise's checks try between
    two marker lines; a lesson without them has no list, and the build
    refuses it."""
    problem = _list_of_checks_problem(chapter, _lesson(chapter.folder))
    assert problem is None, problem


@pytest.mark.parametrize("change", ["no-end", "no-markers", "no-section", "outside"])
def test_a_lesson_without_its_markers_fails_naming_its_chapter_and_the_recipe(change):
    chapter = CHAPTERS[-1]
    lesson = _lesson(chapter.folder)
    assert _list_of_checks_problem(chapter, lesson) is None
    changed = {
        "no-end": lesson.replace(END, ""),
        "no-markers": lesson.replace(BEGIN, "").replace(END, ""),
        "no-section": lesson.replace("The exercises and how they are graded", "Exercises"),
        "outside": lesson.replace("\n## 1. ", f"\n{BEGIN}\n\n## 1. ", 1),
    }[change]
    problem = _list_of_checks_problem(chapter, changed)
    assert problem.startswith(f"{chapter.id}: chapters/{chapter.folder}/README.md")
    assert problem.endswith("see grader/README.md, Adding a chapter")


# -- claims a reader can check with torch ---------------------------------------------------


def _lesson(folder: str) -> str:
    return (COURSE_ROOT / "chapters" / folder / "README.md").read_text(encoding="utf-8")


def _paragraph(text: str, start: str) -> str:
    """The paragraph (or list item) that begins with ``start``, its lines joined."""
    at = text.index(start)
    end = min(found for found in (text.find("\n\n", at), text.find("\n- ", at), len(text)) if found >= 0)
    return " ".join(text[at:end].split())


def test_ch02_a_misplaced_padding_mask_is_silent_with_one_query():
    """A ``(B, S)`` mask against ``(B, L, S)`` scores meets ``L`` with ``B``:
    an error where they differ, except where ``L = 1`` (a decoding step),
    which broadcasts; the lesson says so where it says the rest."""
    key_is_real = torch.arange(3) < torch.tensor([3, 1])[:, None]  # (B, S) = (2, 3)
    with pytest.raises(RuntimeError):
        torch.zeros(2, 4, 3).masked_fill(~key_is_real, float("-inf"))  # (B, L, S) = (2, 4, 3)
    stretched = torch.zeros(2, 1, 3).masked_fill(~key_is_real, float("-inf"))  # L = 1
    assert stretched.shape == (2, 2, 3)  # no error: every sequence's query under every padding
    assert torch.where(key_is_real, torch.zeros(2, 1, 3), float("-inf")).shape == (2, 2, 3)
    with pytest.raises(RuntimeError):
        torch.zeros(2, 1, 3).masked_fill_(~key_is_real, float("-inf"))  # in place it cannot grow
    lesson = _lesson("02_cross_attention")
    for start in ("**The silent case.**", "- **A `(B, S)` mask against"):
        assert "`L = 1`" in _paragraph(lesson, start), start
    # Lengths without their None, (S,) against (B,): an error, but where either is 1.
    with pytest.raises(RuntimeError):
        torch.lt(torch.arange(5), torch.tensor([3, 5, 2]))
    assert (torch.arange(1) < torch.tensor([3, 5, 2])).shape == (3,)
    assert "or one of them is 1" in _paragraph(lesson, "- Broadcasting lines shapes up from the right.")


def test_ch06_a_per_sequence_mask_broadcasts_over_a_single_head():
    """A ``(B, L, S)`` mask against ``(B, H_q, L, S)`` scores meets the heads
    with ``B``: with one head it broadcasts, and the lesson names that case."""
    mask = torch.rand(2, 3, 5) < 0.5  # (B, L, S)
    with pytest.raises(RuntimeError):
        torch.zeros(2, 4, 3, 5).masked_fill(~mask, float("-inf"))  # H_q = 4
    assert torch.zeros(2, 1, 3, 5).masked_fill(~mask, float("-inf")).shape == (2, 2, 3, 5)  # H_q = 1
    paragraph = _paragraph(_lesson("06_grouped_query_attention"), "Broadcasting lines shapes up from the right.")
    assert "$H_q = 1$" in paragraph and "(B, B, L, S)" in paragraph


def _attention_with_lse(q, k, v, sees):
    """Attention over the keys ``sees`` allows, and its log-sum-exp ((0, -inf) for no key)."""
    scores = (q @ k.transpose(-2, -1) / q.shape[-1] ** 0.5).masked_fill(~sees, float("-inf"))  # (L, S)
    lse = torch.logsumexp(scores, dim=-1)  # (L,)
    weights = torch.exp(scores - lse[:, None].masked_fill(torch.isneginf(lse)[:, None], 0.0))
    return weights @ v, lse


def _bottom_right(num_queries, num_keys):
    """(L, S): query i sees keys 0 .. i + S - L (chapter 4)."""
    return torch.ones(num_queries, num_keys, dtype=torch.bool).tril(num_keys - num_queries)


def test_ch07_a_full_part_and_a_causal_part_merge_into_causal_attention_up_to_one_query_more():
    """Part A seen whole and part B with its bottom-right mask merge into
    causal attention over A and B exactly when ``L <= S_B + 1``; the lesson
    states that condition."""
    generator = torch.Generator().manual_seed(0)
    keys_a, keys_b = 3, 4
    k, v = torch.randn(keys_a + keys_b, 8, generator=generator, dtype=torch.float64), \
        torch.randn(keys_a + keys_b, 5, generator=generator, dtype=torch.float64)
    equal = {}
    for queries in range(1, keys_b + 4):
        q = torch.randn(queries, 8, generator=generator, dtype=torch.float64)
        out_a, lse_a = _attention_with_lse(q, k[:keys_a], v[:keys_a], torch.ones(queries, keys_a, dtype=torch.bool))
        out_b, lse_b = _attention_with_lse(q, k[keys_a:], v[keys_a:], _bottom_right(queries, keys_b))
        lse = torch.logaddexp(lse_a, lse_b)
        merged = torch.exp(lse_a - lse)[:, None] * out_a + torch.exp(lse_b - lse)[:, None] * out_b
        whole, _ = _attention_with_lse(q, k, v, _bottom_right(queries, keys_a + keys_b))
        equal[queries] = torch.allclose(merged, whole)
    assert equal == {queries: queries <= keys_b + 1 for queries in equal}
    paragraph = _paragraph(_lesson("07_memory_efficient_attention"), "So `tiled_attention` over two parts")
    assert "$L \\le S_B + 1$" in paragraph


def test_ch08_does_not_say_pre_norm_needs_no_warm_up():
    """Pre-norm depends far less on a learning-rate warm-up (Xiong et al.,
    2020), but large pre-norm models still warm up: GPT-3 and LLaMA did."""
    paragraph = _paragraph(_lesson("08_tiny_language_model"), "*Pre-norm* means")
    assert "trains without the learning-rate warm-up" not in paragraph
    assert all(name in paragraph for name in ("Xiong et al.", "GPT-3", "LLaMA")), paragraph
