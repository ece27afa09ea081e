"""Chapter 12 (multi-head latent attention): the reference scores full marks and the stub
zero; the reference is the paper's MLA (its absorbed decode equals its naive form, its
cache is d_c + d_R numbers a token); a decode that up-projects every cached latent, the
non-absorbed form, still passes (the checks judge values), with a note from the worker's
measure that names its largest tensor; a decode that
caches per-head keys fails the cache check, which names it; and the lesson's numbers are
the reference's."""

import importlib.util
import re

import pytest
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
from grader.known_bugs import KNOWN_BUGS, apply_bug

CH12 = find_chapter("ch12")
SOLUTION = solution_source(CH12)
LESSON = COURSE_ROOT / "chapters" / CH12.folder


def _reference():
    spec = importlib.util.spec_from_file_location("reference_ch12_for_tests", CH12.solution())
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _bug(exercise: str, name: str):
    return next(bug for bug in KNOWN_BUGS["ch12"] if bug.exercise == exercise and bug.name == name)


def _failed(report, exercise: str) -> dict[str, str]:
    """``{check title: message}`` of the exercise's failed checks."""
    return {check.check: check.message for check in result_of(report, exercise).failed_checks}


def test_solution_scores_full_marks_and_stub_scores_zero(grade_source):
    solved = grade_source(SOLUTION, chapter="ch12")
    assert solved.passed and solved.score == solved.max_score == 9
    stub = grade_source(stub_source(CH12), chapter="ch12")
    assert stub.score == 0
    assert set(statuses(stub).values()) == {"not implemented"}


# -- the reference is the paper's MLA ----------------------------------------------------------


@pytest.mark.parametrize("dims", [(16, 4, 4, 4, 6, 8), (12, 3, 4, 2, 4, 6), (8, 2, 6, 2, 10, 4)],
                         ids=["dc6-dh4", "square", "dc10-dh6"])
def test_the_absorbed_decode_is_the_naive_form_token_by_token(dims):
    torch.manual_seed(12)
    reference = _reference()
    module = reference.MultiHeadLatentAttention(*dims).double()
    x = torch.randn(2, 7, dims[0], dtype=torch.float64)
    whole = module(x)
    cache = None
    for step in range(7):
        output, cache = reference.absorbed_decode(module, x[:, step:step + 1], cache)
        torch.testing.assert_close(output, whole[:, step:step + 1], rtol=1e-12, atol=1e-12)
    latent, rope_keys = cache
    assert latent.shape == (2, 7, dims[4]) and rope_keys.shape == (2, 7, dims[3])
    torch.testing.assert_close(latent, module.kv_down(x))


def test_the_reference_is_sdpa_on_the_concatenated_heads():
    """F.scaled_dot_product_attention's default scale, 1/sqrt(q.shape[-1]), is MLA's on
    [q_C; q_R], d_h + d_R wide: the lesson's remark about the default."""
    torch.manual_seed(3)
    reference = _reference()
    module = reference.MultiHeadLatentAttention(16, 4, 4, 4, 6, 8).double()
    x = torch.randn(2, 5, 16, dtype=torch.float64)
    positions = torch.arange(5)
    c_q, c_kv = module.q_down(x), module.kv_down(x)
    q = torch.cat([module.q_up(c_q).unflatten(-1, (4, 4)).transpose(1, 2),
                   reference.apply_rope(module.q_rope(c_q).unflatten(-1, (4, 4)).transpose(1, 2), positions)], -1)
    k_rope = reference.apply_rope(module.k_rope(x), positions)[:, None].expand(2, 4, 5, 4)
    k = torch.cat([module.k_up(c_kv).unflatten(-1, (4, 4)).transpose(1, 2), k_rope], -1)
    v = module.v_up(c_kv).unflatten(-1, (4, 4)).transpose(1, 2)
    out = torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True)  # default scale
    torch.testing.assert_close(module.out_proj(out.transpose(1, 2).flatten(2)), module(x))


# -- what the checks say ------------------------------------------------------------------------

# The decode that is not absorbed: every cached latent up-projected to H keys and values at
# every step. Right values, the naive cost; the checks judge values, so it passes.
NOT_ABSORBED = '''
def absorbed_decode(module, x, cache=None):
    batch = x.shape[0]
    rope_dim = module.k_rope.weight.shape[0]
    heads = module.q_rope.weight.shape[0] // rope_dim
    past = 0 if cache is None else cache[0].shape[1]
    position = torch.tensor([past], device=x.device)
    c_q = module.q_down(x)
    q = torch.cat([module.q_up(c_q).view(batch, 1, heads, -1).transpose(1, 2),
                   apply_rope(module.q_rope(c_q).view(batch, 1, heads, -1).transpose(1, 2), position)], -1)
    latent, rope_keys = module.kv_down(x), apply_rope(module.k_rope(x), position)
    if cache is not None:
        latent, rope_keys = torch.cat([cache[0], latent], 1), torch.cat([cache[1], rope_keys], 1)
    length = latent.shape[1]
    k = torch.cat([module.k_up(latent).view(batch, length, heads, -1).transpose(1, 2),
                   rope_keys[:, None].expand(batch, heads, length, rope_dim)], -1)
    v = module.v_up(latent).view(batch, length, heads, -1).transpose(1, 2)
    out = torch.softmax(q @ k.transpose(-2, -1) / math.sqrt(q.shape[-1]), dim=-1) @ v
    return module.out_proj(out.transpose(1, 2).reshape(batch, 1, -1)), (latent, rope_keys)
'''


def test_a_decode_that_up_projects_the_cache_passes_with_a_note(grade_source):
    report = grade_source(replace_function(SOLUTION, "absorbed_decode", NOT_ABSORBED), chapter="ch12")
    assert report.passed, [(r.exercise.name, r.reason) for r in report.exercises if r.status != "passed"]
    assert "made a (1, 8, 256, 20) tensor" in result_of(report, "absorbed_decode").note  # [k_C; k_R] of every token
    assert "never up-projecting a cached latent" in result_of(report, "absorbed_decode").note


def test_the_absorbed_decode_gets_no_note(grade_source):
    assert not result_of(grade_source(SOLUTION, chapter="ch12"), "absorbed_decode").note


def test_a_decode_that_caches_per_head_keys_is_told_so(grade_source):
    report = grade_source(apply_bug(SOLUTION, _bug("absorbed_decode", "up-projected-cache")), chapter="ch12")
    failed = _failed(report, "absorbed_decode")
    cache_checks = [message for title, message in failed.items() if title.startswith("returns the cache")]
    assert cache_checks and all("per-head keys or values?" in message for message in cache_checks)
    assert statuses(report)["MultiHeadLatentAttention"] == "passed"
    assert result_of(report, "absorbed_decode").reason.startswith(_bug("absorbed_decode", "up-projected-cache").hint)


def test_a_per_head_rope_key_is_named(grade_source):
    bug = _bug("MultiHeadLatentAttention", "rope-key-per-head")
    report = grade_source(apply_bug(SOLUTION, bug), chapter="ch12")
    assert result_of(report, "MultiHeadLatentAttention").reason.startswith(bug.hint)
    loading = [check for check in result_of(report, "MultiHeadLatentAttention").failed_checks
               if "k_rope.weight has shape" in check.message]
    assert loading and all(check.hint == bug.hint for check in loading)


def test_the_transposed_absorption_is_named_where_it_raises_and_where_it_returns(grade_source):
    bug = _bug("absorbed_decode", "w-uk-transposed")
    report = grade_source(apply_bug(SOLUTION, bug), chapter="ch12")
    checks = result_of(report, "absorbed_decode").failed_checks
    square = [check for check in checks if "square" in check.check]
    raised = [check for check in checks if "raised" in check.message]
    assert square and raised
    assert all(check.hint and check.hint.startswith(bug.hint) for check in square + raised)


# -- the lesson's numbers -------------------------------------------------------------------------


def test_the_lessons_cache_numbers_are_the_references():
    reference = _reference()
    lesson = (LESSON / "README.md").read_text(encoding="utf-8")
    mla = reference.latent_cache_bytes(1, 1, 60, 128, 128, 512, 64, torch.bfloat16)
    mha = 2 * 60 * 128 * 128 * 2  # chapter 6's formula: a key and a value, 128 heads of 128, 60 layers
    assert f"{mla:,}" == "69,120" and f"{mha:,}" == "3,932,160"
    for text in ("69,120", "3,932,160", "576", "32,768", "2.25", "1.76%"):
        assert text in lesson, text
    assert f"{576 / 32768:.2%}" == "1.76%"
    gib = reference.latent_cache_bytes(8, 128 * 1024, 60, 128, 128, 512, 64, torch.bfloat16) / 2**30
    assert f"{gib:.2f}" == "67.50"
    assert "67.50 GiB" in lesson and "3840 GiB" in lesson
    assert 2 * 60 * 128 * 128 * 2 * 8 * 128 * 1024 / 2**30 == 3840


def test_the_lessons_worked_example_is_the_references():
    """Section 5's numbers: the tiny model the lesson runs by hand."""
    reference = _reference()
    lesson = (LESSON / "README.md").read_text(encoding="utf-8")
    example = re.search(r"<!-- worked example: begin -->(.*?)<!-- worked example: end -->", lesson, re.DOTALL).group(1)
    module = reference.MultiHeadLatentAttention(2, 1, 2, 2, 1, 1)
    state = {"q_down.weight": [[1.0, 1.0]], "q_up.weight": [[1.0], [0.0]], "q_rope.weight": [[0.0], [1.0]],
             "kv_down.weight": [[0.0, 1.0]], "k_up.weight": [[2.0], [0.0]], "v_up.weight": [[1.0], [-1.0]],
             "k_rope.weight": [[1.0, 0.0], [0.0, 1.0]], "out_proj.weight": [[1.0, 0.0], [0.0, 1.0]]}
    module.load_state_dict({name: torch.tensor(value) for name, value in state.items()})
    x = torch.tensor([[[1.0, 0.0], [0.0, 1.0]]])
    with torch.no_grad():
        whole = module(x)
        _, cache = reference.absorbed_decode(module, x[:, :1])
        second, cache = reference.absorbed_decode(module, x[:, 1:], cache)
    torch.testing.assert_close(second, whole[:, 1:])
    numbers = re.findall(r"-?\d+\.\d+", example)
    for value in (*whole[0, 1].tolist(), *cache[1][0, 1].tolist()):
        assert f"{value:.4f}" in numbers, value


# -- what the whole-course tests take from this chapter (tests/conftest.py's chapter_tests) --


def samples(draw: Draw) -> list:
    """Calls of every exercise, ``[(exercise name, args, kwargs), ...]``, made on the
    reference and on each correct style (tests/test_correct_styles.py); a class's args
    are ``(init args, call args, call kwargs)``."""
    dims, square = (16, 4, 4, 4, 6, 8), (12, 3, 4, 2, 4, 6)
    cache = (draw.randn(2, 3, 6), draw.randn(2, 3, 4))
    return [
        ("MultiHeadLatentAttention", (dims, (draw.randn(2, 5, 16),), {}), {}),
        ("MultiHeadLatentAttention", ((8, 2, 6, 2, 10, 4), (draw.randn(1, 4, 8),), {}), {}),
        ("MultiHeadLatentAttention", (dims, (draw.randn(2, 1, 16),), {}), {"passed_to": "absorbed_decode"}),
        ("MultiHeadLatentAttention", (dims, (draw.randn(2, 1, 16), cache), {}), {"passed_to": "absorbed_decode"}),
        ("MultiHeadLatentAttention", (square, (draw.randn(1, 1, 12), (draw.randn(1, 5, 4), draw.randn(1, 5, 2))),
                                      {}), {"passed_to": "absorbed_decode"}),
        ("latent_cache_bytes", (2, 128, 4, 8, 16, 32, 8, torch.bfloat16), {}),
        ("latent_cache_bytes", (1, 4096, 60, 128, 128, 512, 64, torch.int8), {}),
    ]


# A known bug of grader/chapters/ch12/bugs.py that tests/test_release.py makes in both trees.
RELEASE_BUG = ("absorbed_decode", "scale-of-latent-width")
