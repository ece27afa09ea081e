"""No secret is in a worker's memory, in any mode.

A worker runs student code, and student code can read every byte of its
own process (``/proc/self/mem``) and put what it finds in an error message,
which reaches the grade's output. So nothing secret may be in a worker's
memory: not the hidden checks, the oracles, the reference solutions, the
known bugs, nor the student edition's recorded answers. Each test below
grades a submission whose first exercise searches its worker's memory for
all of them, in one mode of the grader: ``grade`` (one chapter; several side
by side), ``watch`` (a second grade from a warm process), ``batch``, the
student edition and the Gradescope bundle.

The search cannot carry the secrets in clear (the submission's own source
is in the worker's memory too): it carries a hash of each, and hashes every
run of printable bytes of at least ``MIN_LENGTH`` it finds (a line of a text
read from a file; a string object, the constants of an imported module).
What legitimately appears elsewhere (the stubs and notebooks share their
docstrings and signatures with the solutions; the grader's own modules; the
submission's source; torch) is not searched for. A canary the search builds
at run time proves that it works; a grade from this test process, which has
read the reference, proves that it finds a real secret.
"""

from __future__ import annotations

import ast
import contextlib
import hashlib
import json
import os
import pwd
import re
import subprocess
import sys
import zipfile
from functools import cache
from pathlib import Path

import numpy

from conftest import EDITION_SEED, replace_function
from grader.catalog import COURSE_ROOT, find_chapter
from grader.grading import grade
from grader.known_bugs import KNOWN_BUGS
from grader.recorded import Recording
from grader.sandbox import Limits
from test_watch import Watcher

CH01 = find_chapter("ch01")
MIN_LENGTH = 30  # shorter lines (``return out``, ``import torch``) are everyone's
DIGEST_SIZE = 8
CANARY = " ".join(["canary", "of", "the", "memory", "search:", *map(str, range(12))])
# Where a secret lives: a file mapped from one of these is a secret in memory too.
SECRET_FOLDERS = ("grader/checks.py", "grader/oracles.py", "grader/chapters/", "grader/recorded/", "solutions/")
SCAN_MESSAGE = re.compile(r"memory search of (\d+) MiB, (with|without) its canary, (\d+) secret files? mapped: "
                          r"(\d+) found:((?: [0-9a-f]{8})*)")


def secret_files(root: Path = COURSE_ROOT) -> list[Path]:
    """The hidden checks and their ini, the oracles, the reference solutions
    and the known-bug catalog: every chapter's grading package, and what
    they share (``checks.py``, ``oracles.py``)."""
    grader_folder = root / "grader"
    return sorted([*(grader_folder / "chapters").rglob("*.py"), grader_folder / "chapters" / "pytest.ini",
                   grader_folder / "checks.py", grader_folder / "oracles.py",
                   *(root / "solutions").glob("*.py")])


def public_files(root: Path = COURSE_ROOT) -> list[Path]:
    """What a worker may hold: the stubs and notebooks, the grader's other modules."""
    secret = set(secret_files(root))
    grader_modules = [path for path in (root / "grader").rglob("*.py") if path not in secret]
    return sorted([*(root / "exercises").glob("*.py"), *(root / "exercises").glob("*.ipynb"), *grader_modules])


def texts_of(path: Path) -> set[str]:
    """The stripped lines of a file and of the strings its code holds (a
    module's constants are in memory once it is imported), at least
    ``MIN_LENGTH`` long; a notebook's are its cells'."""
    text = path.read_text(encoding="utf-8")
    if path.suffix == ".ipynb":
        text = "\n".join("".join(cell.get("source", "")) for cell in json.loads(text)["cells"])
    pieces = text.splitlines()
    if path.suffix in (".py", ".ipynb"):
        try:
            tree = ast.parse(text)
        except SyntaxError:  # a notebook's magic lines: its lines will do
            tree = None
        if tree is not None:
            pieces += [line for node in ast.walk(tree)
                       if isinstance(node, ast.Constant) and isinstance(node.value, str)
                       for line in node.value.splitlines()]
    return {piece.strip() for piece in pieces if len(piece.strip()) >= MIN_LENGTH}


def digest(text: str) -> bytes:
    return hashlib.blake2b(text.encode(), digest_size=DIGEST_SIZE).digest()


@cache
def secrets_by_id() -> dict[str, str]:
    """``{id: text}`` of every secret searched for; an id is the first 8 hex
    digits of its digest. A known bug's hint is shown to students: not one."""
    public = set().union(*map(texts_of, public_files()))
    public |= {bug.hint.strip() for bugs in KNOWN_BUGS.values() for bug in bugs}
    secret = set().union(*map(texts_of, secret_files())) - public
    return {digest(text).hex()[:8]: text for text in sorted(secret)}


def memory_search(secrets: dict[str, str]) -> str:
    """Module-level code that defines ``_memory_search()``: read every
    readable byte of this process that can hold data the grader wrote, look
    for ``secrets`` (``{id: text}``) by their digests, and raise an error
    that says what it found (``SCAN_MESSAGE``): how much it read, whether
    it found its canary, how many mappings of a secret file it saw, and
    how many secrets it found, with the ids of the first 40.

    Left out of the search: a mapping of a file that is not writable holds
    that file's bytes (a library's code and constants), not anything the
    grader read or computed (such a mapping of a secret file is reported);
    the kernel's own pages ([vvar], [vdso]) hold no data of the process.
    Read through /proc/self/mem; a worker that runs as another account
    cannot open it (its process is not dumpable), and reads its memory
    directly instead, with ctypes (which torch imports)."""
    digests = {digest(text).hex() for text in [*secrets.values(), CANARY]}
    return f'''

_SEARCHED = {{}}


def _memory_reader():
    try:
        memory = open("/proc/self/mem", "rb", buffering=0)
    except OSError:
        import torch

        def read(start, size):
            return torch.ctypes.string_at(start, size)
        return read

    def read(start, size):
        try:
            memory.seek(start)
            return memory.read(size)
        except (OSError, OverflowError, ValueError):
            return None
    return read


def _memory_search():
    import hashlib

    if "message" not in _SEARCHED:
        wanted = set(bytes.fromhex({"".join(sorted(digests))!r}[i:i + {2 * DIGEST_SIZE}])
                     for i in range(0, {len(digests) * 2 * DIGEST_SIZE}, {2 * DIGEST_SIZE}))
        canary = " ".join(["canary", "of", "the", "memory", "search:"] + [str(n) for n in range(12)])
        text = "\\n".join(["a line before", canary, "a line after"])  # alive until the search ends
        printable = bytes(1 if byte == 9 or 32 <= byte < 127 or byte >= 128 else 0 for byte in range(256))
        run = bytes([1]) * {MIN_LENGTH}
        regions, mapped = [], []
        with open("/proc/self/maps") as maps:
            for line in maps:
                fields = line.split(maxsplit=5)
                path = fields[5].strip() if len(fields) > 5 else ""
                if any(folder in path for folder in {SECRET_FOLDERS!r}):
                    mapped.append(path)
                if ("r" not in fields[1] or path.startswith("/") and "w" not in fields[1]
                        or path and not path.startswith(("/", "[heap]", "[stack", "[anon"))):
                    continue  # not readable; a file's own bytes; the kernel's pages ([vvar], [vdso])
                start, end = (int(part, 16) for part in fields[0].split("-"))
                regions.append((start, end))
        read = _memory_reader()
        found, searched = set(), 0
        for start, end in regions:
            at = start
            while at < end:
                data = read(at, min(2 ** 25, end - at))
                if not data:
                    break
                searched += len(data)
                mask = data.translate(printable)
                step, i = len(data), mask.find(run)
                while i >= 0:
                    j = mask.find(bytes(1), i)
                    if j < 0 and at + len(data) < end and i > 0:
                        step = i  # a run on into the next chunk: read it whole from there
                        break
                    j = len(data) if j < 0 else j
                    digest = hashlib.blake2b(data[i:j].strip(), digest_size={DIGEST_SIZE}).digest()
                    if digest in wanted:
                        found.add(digest.hex()[:8])
                    i = mask.find(run, j)
                at += step
        mark = hashlib.blake2b(canary.encode(), digest_size={DIGEST_SIZE}).digest().hex()[:8]
        seen = "with" if mark in found else "without"
        found.discard(mark)
        _SEARCHED["message"] = (f"memory search of {{searched >> 20}} MiB, {{seen}} its canary, "
                                f"{{len(set(mapped))}} secret files mapped: {{len(found)}} found: "
                                + " ".join(sorted(found)[:40]))
    raise RuntimeError(_SEARCHED["message"])
'''


def searching(chapter, secrets: dict[str, str] | None = None) -> str:
    """The chapter's stub whose first exercise searches its worker's memory
    for ``secrets`` (by default every one, ``secrets_by_id()``)."""
    first = chapter.exercises[0].name
    source = chapter.stub().read_text(encoding="utf-8")
    return replace_function(source, first, f"def {first}(*args, **kwargs):\n    return _memory_search()\n") \
        + memory_search(secrets_by_id() if secrets is None else secrets)


def found_in(output: str, secrets: dict[str, str] | None = None) -> dict[str, str]:
    """``{id: text}`` of the ``secrets`` (by default every one) that the
    search reported, but for lines that the libraries a worker imports
    hold too; fails when the search did not run or missed its canary."""
    match = SCAN_MESSAGE.search(" ".join(output.split()))
    assert match, f"the memory search did not report: {output}"
    assert match.group(2) == "with", f"the search missed its canary: {match.group(0)}"
    assert int(match.group(1)) > 10, f"the search read almost nothing: {match.group(0)}"
    ids, count = match.group(5).split(), int(match.group(4))
    known = secrets_by_id() if secrets is None else secrets
    found = {key: known[key] for key in ids}
    everyones = in_libraries(set(found.values())) if found else set()
    found = {key: text for key, text in found.items() if text not in everyones}
    if count > len(ids):  # more than the message could list
        found["..."] = f"{count} in all"
    if int(match.group(3)):
        found["mapped"] = f"{match.group(3)} secret file(s) mapped into memory"
    return found


# ``in_libraries``'s answers so far, ``{text: whether a library holds it}``: a scan of
# the libraries' code reads every file of them (2.5 s of CPU), and the searches of
# this file's tests report the same few lines, so each is looked for once a process.
_IN_LIBRARIES: dict[str, bool] = {}


def in_libraries(texts: set[str]) -> set[str]:
    """Those of ``texts`` that are a line of the Python code a worker
    imports besides the course's (the standard library, torch, NumPy): a
    worker may hold any of those."""
    import torch

    unknown = set(texts) - _IN_LIBRARIES.keys()
    found: set[str] = set()
    if unknown:
        for folder in {Path(os.__file__).parent, Path(torch.__file__).parent, Path(numpy.__file__).parent}:
            for path in folder.rglob("*.py"):
                try:
                    text = path.read_text(encoding="utf-8")
                except (OSError, UnicodeDecodeError):
                    continue
                if any(line in text for line in unknown - found):  # a few lines checked whole, the rest skipped
                    found |= unknown & {line.strip() for line in text.splitlines()}
        _IN_LIBRARIES.update((line, line in found) for line in unknown)
    return {line for line in texts if _IN_LIBRARIES[line]}


def assert_nothing_secret(output: str, secrets: dict[str, str] | None = None) -> None:
    found = found_in(output, secrets)
    assert not found, f"a worker's memory holds {len(found)} secret line(s), e.g. " + "; ".join(
        repr(text) for text in list(found.values())[:5])


def test_the_search_finds_a_secret_where_there_is_one(tmp_path):
    """The control: this test process has read the reference solutions
    (conftest), and ``grading.grade`` called as a library forks its workers'
    server from the calling process; the search finds most of chapter 1's
    reference there."""
    solution = texts_of(CH01.solution())  # read once, not once a secret (10 s of CPU)
    reference = {key: text for key, text in secrets_by_id().items() if text in solution}
    path = tmp_path / CH01.file_name
    path.write_text(searching(CH01, reference), encoding="utf-8")
    report = grade([(CH01, path)], limits=Limits.per_check(30), seed=1, only={CH01.exercises[0].name})
    message = report.exercises[0].failed_checks[0].message
    match = SCAN_MESSAGE.search(message)
    assert match and match.group(2) == "with", message
    assert int(match.group(4)) > len(reference) / 2, message


def cli(*args: str, cwd: Path = COURSE_ROOT, env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "grader", *args], cwd=cwd, env=env, capture_output=True,
                          text=True, timeout=300)


def first_exercise_output(results: dict, chapter) -> str:
    name = f"{chapter.id} {chapter.exercises[0].name}:"
    return next(test["output"] for test in results["tests"] if test["name"].startswith(name))


def test_grade_keeps_every_secret_out_of_its_workers(tmp_path):
    path = tmp_path / CH01.file_name
    path.write_text(searching(CH01), encoding="utf-8")
    done = cli("grade", str(path), "--json", "--seed", "1", "--timeout", "30")
    assert done.stdout, done.stderr
    assert_nothing_secret(first_exercise_output(json.loads(done.stdout), CH01))


SIDE_BY_SIDE = [find_chapter(name) for name in ("ch01", "ch02", "ch04")]


def test_chapters_graded_side_by_side_keep_every_secret_out_of_their_workers(tmp_path):
    """Each chapter's checks run in a process of their own (``grader.side_by_side``)."""
    for chapter in SIDE_BY_SIDE:
        (tmp_path / chapter.file_name).write_text(searching(chapter), encoding="utf-8")
    done = cli("grade", "--dir", str(tmp_path), "--json", "--seed", "1", "--timeout", "30")
    assert done.stdout, done.stderr
    results = json.loads(done.stdout)
    for chapter in SIDE_BY_SIDE:
        assert_nothing_secret(first_exercise_output(results, chapter))


def test_watch_keeps_every_secret_out_of_its_workers(tmp_path):
    """The second grade comes from a process that has run the checks, the
    reference and the known bugs once already."""
    path = tmp_path / CH01.file_name
    source = searching(CH01)
    path.write_text(source, encoding="utf-8")
    watcher = Watcher("ch01", "--dir", str(tmp_path), "--seed", "1", "--timeout", "30", cwd=COURSE_ROOT)
    try:
        first = watcher.report()
        path.write_text(source + "\n# saved again\n", encoding="utf-8")
        second = watcher.report()
    finally:
        watcher.interrupt()
    assert_nothing_secret(first)
    assert_nothing_secret(second)


def test_a_batch_keeps_every_secret_out_of_its_workers(tmp_path):
    """Each student is graded in a process forked from the batch's."""
    for student, source in (("alice", CH01.solution().read_text(encoding="utf-8")), ("mallory", searching(CH01))):
        (tmp_path / "class" / student).mkdir(parents=True)
        (tmp_path / "class" / student / CH01.file_name).write_text(source, encoding="utf-8")
    done = cli("batch", str(tmp_path / "class"), "--out", str(tmp_path / "grades"), "--seed", "1",
               "--timeout", "30", "--jobs", "2")
    assert done.returncode == 0, done.stderr
    results = json.loads((tmp_path / "grades" / "results" / "mallory.json").read_text(encoding="utf-8"))
    assert_nothing_secret(first_exercise_output(results, CH01))
    alice = json.loads((tmp_path / "grades" / "results" / "alice.json").read_text(encoding="utf-8"))
    assert sum(test["score"] for test in alice["tests"] if test["name"].startswith("ch01 ")) == CH01.points


# The suite's student edition (conftest's ``edition``): every chapter recorded with two
# seeds, chapter 1's among them.
def test_the_student_edition_keeps_every_secret_out_of_its_workers(edition, tmp_path):
    """Besides the checks, the recorded answers: each call's key (a digest,
    in memory once a recording is read) stands for them."""
    recording = Recording.load(edition / "grader" / "recorded" / f"{CH01.id}.rec")
    keys = [*recording.answers, *recording.lookalikes]
    assert keys
    secrets = {**secrets_by_id(), **{digest(key).hex()[:8]: key for key in keys}}
    path = tmp_path / CH01.file_name
    path.write_text(searching(CH01, secrets), encoding="utf-8")
    done = cli("grade", str(path), "--json", "--seed", str(EDITION_SEED), "--timeout", "30", cwd=edition,
               env={**os.environ, "PYTHONPATH": str(edition)})
    assert done.stdout, done.stderr
    assert_nothing_secret(first_exercise_output(json.loads(done.stdout), CH01), secrets)


def test_the_gradescope_bundle_keeps_every_secret_out_of_its_workers(tmp_path):
    """Graded as Gradescope grades: run_autograder, as root where the tests
    run as root; workers then run as another account where this machine's
    Python lets one run it."""
    from grader.gradescope import write_bundle
    from grader.hosted import can_run_python

    bundle = tmp_path / "autograder.zip"
    write_bundle(bundle)
    root = tmp_path / "autograder"
    with zipfile.ZipFile(bundle) as archive:
        archive.extractall(root / "source")
    (root / "submission").mkdir()
    (root / "results").mkdir()
    (root / "submission" / CH01.file_name).write_text(searching(CH01), encoding="utf-8")
    env = {**os.environ, "AUTOGRADER_ROOT": str(root), "MHA_COURSE_PYTHON": sys.executable,
           "MHA_COURSE_VENV": str(root / "no-venv")}
    with_account = False
    if hasattr(os, "geteuid") and os.geteuid() == 0:
        with contextlib.suppress(KeyError):
            nobody = pwd.getpwnam("nobody")
            with_account = can_run_python(nobody.pw_uid, nobody.pw_gid)
    if with_account:
        env["MHA_COURSE_STUDENT_USER"] = "nobody"
    done = subprocess.run(["bash", str(root / "source" / "run_autograder")], cwd=root, env=env,
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stdout + done.stderr
    if with_account:
        assert "student code runs as nobody" in done.stdout, done.stdout
    results = json.loads((root / "results" / "results.json").read_text(encoding="utf-8"))
    assert_nothing_secret(first_exercise_output(results, CH01))


def test_what_a_worker_inherits_imports_no_secret():
    """What a command has imported when it forks its clean parent (the
    worker, the sandbox, the fork server, the command line, a batch's and
    Gradescope's modules) is neither a check, an oracle, a known bug, a
    reference nor the recordings' reader, nor does it import one."""
    code = ("import sys, grader.batch, grader.cli, grader.gradescope, grader.hosted, grader.prairielearn, "
            "grader.sandbox, grader.watching; "
            "print('\\n'.join(sorted(sys.modules)))")
    done = subprocess.run([sys.executable, "-c", code], cwd=COURSE_ROOT, capture_output=True, text=True,
                          timeout=120, check=True)
    modules = done.stdout.split()
    secret = ("grader.checks", "grader.oracles", "grader.chapters", "grader.known_bugs", "grader.recorded",
              "grader.check_runner", "reference_")
    assert [name for name in modules if name.startswith(secret)] == []
