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

from grader.bugs import known_bugs_catalog
from grader.catalog import CHAPTERS, COURSE_ROOT

TAG = re.compile(r"<!--\s*known bugs:(.*?)-->", flags=re.DOTALL)

# Known bugs that no pitfall needs to name, each with why. Empty: every bug
# of the catalog is a mistake worth a warning.
TAUGHT_ELSEWHERE: dict[tuple[str, str], str] = {}


def _pitfalls(chapter) -> str:
    """The text of the lesson's "## N. Pitfalls" section, up to the next section."""
    lesson = (COURSE_ROOT / "chapters" / chapter.folder / "README.md").read_text(encoding="utf-8")
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
        for bug in known_bugs_catalog()[chapter.id]
        if bug.name not in taught and (chapter.id, bug.name) not in TAUGHT_ELSEWHERE
    )
    assert not untaught, f"{chapter.folder}/README.md: no pitfall names {', '.join(untaught)}"


@pytest.mark.parametrize("chapter", CHAPTERS, ids=[chapter.id for chapter in CHAPTERS])
def test_a_pitfall_names_only_bugs_of_the_catalog_and_each_once(chapter):
    names = {bug.name for bug in known_bugs_catalog()[chapter.id]}
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
