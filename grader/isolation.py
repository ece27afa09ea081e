"""The operating system's part of the sandbox: what a worker can reach.

Student code runs in a worker process (``grader.worker``). Before it runs a
single student statement, the worker confines itself here, in every mode
and without root, and from then on the kernel says no:

* **Landlock** (Linux >= 5.13): the worker reads only what Python needs
  (the interpreter's and the installed packages' folders, system libraries,
  a few device files, its own ``/proc`` entry) and the staged copy of the
  submission; it writes only its own scratch folder. The course tree
  (``solutions/``, the hidden checks, the known bugs), other students' files
  and the grader's outputs are out of reach. From ABI 6 its signals and
  abstract unix sockets are scoped to itself: it can neither signal nor
  connect to the grader, the fork server or another worker. From ABI 4 it
  can neither bind nor connect a TCP socket.
* **A seccomp filter** (Linux, x86-64 and arm64): no new processes (threads
  yes) and no new programs (``execve``), no sockets, no namespaces, mounts,
  tracing, BPF or io_uring, and no change to its own rlimits. So nothing a
  worker starts can outlive it, and the limits it was given hold.
* **rlimits** (any POSIX system): address space, CPU time, file size, open
  files, processes, no core files.

A layer the machine lacks is reported once, by ``missing``, and grading goes
on. A layer the machine has but a worker fails to apply ends that worker
(``CONFINEMENT_FAILED``) rather than run student code without it.

The three Landlock calls and the seccomp filter are a small ctypes layer:
the kernel's interface is three system calls and a structure, and a binding
package would be one more dependency in every student's install for less
than a hundred lines (none on PyPI is kept for current ABIs and seccomp).
"""

from __future__ import annotations

import contextlib
import ctypes
import errno
import itertools
import os
import platform
import resource
import signal
import struct
import sys
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

CONFINEMENT_FAILED = 70  # a worker's exit status when it could not confine itself
MAX_FILE_BYTES = 64 * 2**20  # one file a worker writes in its scratch folder
MAX_OPEN_FILES = 256
MAX_EXTRA_PROCESSES = 64  # threads and processes beyond those the account already runs


# How much longer than its CPU time a worker may take by the clock. A grade
# runs one process a core plus one beside whatever else the machine runs:
# with 4 busy processes a core, about 5.5 runnable processes share each
# core and a worker's CPU time advances at a fifth of the clock's speed or
# less, so even code at its CPU limit finishes within 5.5 times the limit.
# Ten leaves that margin again (a container's CPU quota, a busier machine)
# and still stops, within minutes, a worker that uses no CPU at all: one
# asleep or blocked, which no CPU limit ever reaches.
WALL_FACTOR = 10


@dataclass(frozen=True)
class Limits:
    """What one worker may spend.

    Time is the worker's CPU time as the kernel counts it
    (``sandbox.Worker.cpu_seconds``): a busy machine slows correct code
    down but costs it nothing. Each time limit has a wall-clock backstop
    ``WALL_FACTOR`` times longer, for a worker that uses no CPU (asleep,
    blocked). Where the system tells the grader no other process's CPU time
    (no ``/proc``: macOS), the limits are wall time and the backstop never
    comes first.

    Attributes:
        check_seconds: CPU time for one check (and for loading the file).
        exercise_seconds: CPU time for all the checks of one exercise.
        memory_bytes: address space a worker may add to what it inherits
            (0: no limit).
    """

    check_seconds: float = 10.0
    exercise_seconds: float = 40.0
    memory_bytes: int = 2 * 2**30

    @classmethod
    def per_check(cls, seconds: float) -> Limits:
        """The limits a command's ``--timeout`` asks for: ``seconds`` for a
        check, four times that for all the checks of an exercise."""
        return cls(check_seconds=seconds, exercise_seconds=4 * seconds)

    @property
    def check_wall_seconds(self) -> float:
        """The clock's backstop for one check."""
        return WALL_FACTOR * self.check_seconds

    @property
    def exercise_wall_seconds(self) -> float:
        """The clock's backstop for all the checks of one exercise."""
        return WALL_FACTOR * self.exercise_seconds


@dataclass(frozen=True)
class Policy:
    """How the workers of one grade are confined: made in the grader, applied
    by each worker to itself (``confine``).

    Attributes:
        scratch: a folder of the grader's; each worker makes and writes a
            folder of its own inside it, and nothing else.
        python: the folders Python and its packages load from
            (``python_folders``), read-only.
        readable: folders and files a worker may read besides those (the
            staged submissions).
        processes: how many processes and threads the workers' account ran
            when grading began (``processes_of``); a worker may add
            ``MAX_EXTRA_PROCESSES`` (RLIMIT_NPROC counts the account's all).
        account: ``(uid, gid)`` workers become first (the grader runs as
            root, on Gradescope); None: they stay the grader's account.
        layers: the layers this machine has (``available``): one of them
            failing in a worker ends the worker.
        rules: the Landlock rules all its workers share (``fixed_rules``).
    """

    scratch: str
    python: tuple[str, ...] = ()
    readable: tuple[str, ...] = ()
    processes: int = 0
    account: tuple[int, int] | None = None
    layers: frozenset[str] = field(default_factory=frozenset)
    rules: tuple[tuple[str, int], ...] = ()


# -- what this machine offers (in the grader) --------------------------------


def available() -> frozenset[str]:
    """The layers this machine can apply: ``"landlock"``, ``"scopes"``
    (Landlock's signal and socket scoping, ABI >= 6), ``"network"``
    (Landlock's TCP rules, ABI >= 4), ``"seccomp"``."""
    found = set()
    abi = landlock_abi()
    if abi >= 1:
        found.add("landlock")
    if abi >= 4:
        found.add("network")
    if abi >= 6:
        found.add("scopes")
    if _PROGRAM is not None and _prctl(_PR_GET_SECCOMP) == 0:
        found.add("seccomp")
    return frozenset(found)


def missing(layers: frozenset[str]) -> str:
    """One line that says which protections are off on this machine, for
    the top of a grade's or a batch's output; "" when every layer is there."""
    off = []
    if "landlock" not in layers:
        off.append("no Landlock (Linux 5.13 or newer): student code can read and write whatever "
                   "your account can, the reference solutions included")
    elif "scopes" not in layers:
        off.append(f"Landlock ABI {landlock_abi()}, not 6 or newer: student code can signal other "
                   "processes of your account")
    if "seccomp" not in layers:
        off.append("no seccomp filter (Linux on x86-64 or arm64): student code can start processes, "
                   "which the grader kills when the grade ends")
    return f"sandbox: {'; '.join(off)}" if off else ""


def processes_of(uid: int) -> int:
    """How many processes and threads an account runs now (RLIMIT_NPROC
    counts both); 0 where /proc cannot tell."""
    count = 0
    with contextlib.suppress(OSError):
        for entry in os.scandir("/proc"):
            if entry.name.isdigit():
                with contextlib.suppress(OSError):
                    if entry.stat().st_uid == uid:
                        count += len(os.listdir(f"/proc/{entry.name}/task"))
    return count


# -- in the worker --------------------------------------------------------------


def confine(policy: Policy, limits: Limits, inherited: int, budget: int = 0) -> Path:
    """Confine this freshly forked worker; returns its scratch folder (its
    working directory from now on). ``inherited``: the address space it was
    forked with, in bytes (0: unknown). ``budget``: memory it may map beyond
    what it maps now, for the rest of its life (0: none but the limits'),
    the kernel's count of a memory check (``BUDGET_COUNTED`` says where
    there is one). Ends the process with ``CONFINEMENT_FAILED`` when a layer
    ``policy.layers`` names fails."""
    with contextlib.suppress(OSError):
        os.setpgid(0, 0)  # a group of its own: the terminal's Ctrl-C is the grader's
    scratch = Path(policy.scratch) / f"worker-{os.getpid()}"
    try:
        scratch.mkdir(mode=0o700)
        if policy.account is not None:
            os.chown(scratch, *policy.account)
            os.setgroups([])
            os.setgid(policy.account[1])
            os.setuid(policy.account[0])
    except OSError:
        os._exit(CONFINEMENT_FAILED)  # rather no worker than student code running as root
    # Die with the fork server, never linger (after setuid, which clears it).
    _prctl(_PR_SET_PDEATHSIG, signal.SIGKILL)
    _set_limits(limits, inherited, policy.processes, budget)
    # Temporary files, caches (torch's, CUDA's) and the working directory:
    # all in the scratch folder, the one place the worker may write.
    for name in ("TMPDIR", "HOME"):
        os.environ[name] = str(scratch)
    tempfile.tempdir = str(scratch)
    os.chdir(scratch)
    if _prctl(_PR_SET_NO_NEW_PRIVS, 1) != 0 and policy.layers:
        os._exit(CONFINEMENT_FAILED)
    if "landlock" in policy.layers and not _landlock(scratch, policy):
        os._exit(CONFINEMENT_FAILED)
    if "seccomp" in policy.layers and not _seccomp():
        os._exit(CONFINEMENT_FAILED)
    return scratch


def _set_limits(limits: Limits, inherited: int, processes: int, budget: int) -> None:
    """rlimits: a backstop for the grader's own deadlines and checks, and a
    memory check's budget."""
    wanted = [(resource.RLIMIT_CORE, 0), (resource.RLIMIT_FSIZE, MAX_FILE_BYTES),
              (resource.RLIMIT_NOFILE, MAX_OPEN_FILES)]
    space = inherited + limits.memory_bytes if limits.memory_bytes and inherited else 0
    if budget and BUDGET_COUNTED:
        # Every mapping counts (shared ones too, unlike RLIMIT_DATA), taken from now
        # on: no memory put aside beforehand can be reused, since no student code has run.
        _one_mapping_per_large_allocation()
        _no_heap_grows_unseen()
        now = _address_space_now()
        space = min(space, now + budget) if space else now + budget
    if space:
        # The fork inherits torch's address space; allow that plus the budget.
        # (Not with CUDA: it reserves far more address space than it uses.)
        wanted.append((resource.RLIMIT_AS, space))
    if os.getuid() != 0 and hasattr(resource, "RLIMIT_NPROC"):  # root is exempt from it
        wanted.append((resource.RLIMIT_NPROC, (processes or 1024) + MAX_EXTRA_PROCESSES))
    for kind, value in wanted:
        _set_limit(kind, value, value)
    # The grader stops a worker at its CPU limits, and a worker runs at most
    # the file's statements (one check's limit) and one exercise's checks:
    # past their sum and a margin, the kernel ends one whose grader is gone.
    # SIGXCPU first (the grader reports it as a timeout), SIGKILL a second on.
    cpu = int(limits.check_seconds + limits.exercise_seconds) + 5
    _set_limit(resource.RLIMIT_CPU, cpu, cpu + 1)
    # Past the file-size limit a write fails with an error the student reads,
    # instead of a signal that kills the worker without a word.
    signal.signal(signal.SIGXFSZ, signal.SIG_IGN)


def _set_limit(kind: int, soft: int, hard: int) -> None:
    """Lower one rlimit, never above the hard limit already there."""
    with contextlib.suppress(ValueError, OSError):  # not every system enforces each
        _, ceiling = resource.getrlimit(kind)
        if ceiling != resource.RLIM_INFINITY:
            soft, hard = min(soft, ceiling), min(hard, ceiling)
        resource.setrlimit(kind, (soft, hard))


# Where the kernel enforces a limit on a process's address space and
# /proc tells its size: a memory check's budget is counted there (Linux).
BUDGET_COUNTED = sys.platform == "linux"
_M_TRIM_THRESHOLD, _M_MMAP_THRESHOLD = -1, -3  # mallopt's parameters (glibc)
_LARGE = 2**20  # bytes: an allocation this large gets a mapping of its own


def _address_space_now() -> int:
    """This process's address space (VmSize), in bytes."""
    with open("/proc/self/status", encoding="ascii") as status:
        for line in status:
            if line.startswith("VmSize:"):
                return int(line.split()[1]) * 1024
    raise OSError("no VmSize in /proc/self/status")


def _one_mapping_per_large_allocation() -> None:
    """From now on, every block of a MiB or more gets a mapping of its own,
    made when it is allocated and unmapped when it is freed (glibc): the
    address space then follows what a call holds at once, and a budget
    measures that. (Smaller blocks stay in the heap: mapping every block of
    64 KiB made a chapter 7 call twice as slow, for page faults.)

    A threshold alone is not enough: glibc serves a large block from free
    space already in the heap before it maps one, and a worker inherits its
    parent's heap, with however much the parent freed (tens of MiB in a long
    process). That space is in the address space already, so a call could
    use it beyond the budget. The top of the heap goes back to the kernel;
    each free block of a MiB or more left inside is allocated here and never
    freed, which costs no memory (nothing touches it) and leaves large blocks
    nowhere to come from but new mappings."""
    with contextlib.suppress(AttributeError, OSError):  # not glibc: its own allocator, its own habits
        _libc.mallopt(_M_MMAP_THRESHOLD, _LARGE)
        _libc.mallopt(_M_TRIM_THRESHOLD, _LARGE)
        _libc.malloc_trim(0)
        for _ in range(_MAX_HOLES):
            before = _address_space_now()
            block = _libc.malloc(_LARGE)
            if not block or _address_space_now() > before:  # a new mapping: no free block was left
                _libc.free(block)
                break


_MAX_HOLES = 2**16  # free blocks of a MiB a heap may hold (64 GiB of them): a bound, never reached


def _no_heap_grows_unseen() -> None:
    """Unmap the address space that glibc reserved for its other heaps to
    grow into. A thread's heap (the parent's threads leave theirs in every
    fork) is 64 MiB of address space, reserved at once and counted from
    then on, made writable as it grows: an allocation that fails in this
    thread's heap for want of budget is tried again in another, and would
    grow there unseen. Without the reserve, growing fails as a new mapping
    over the budget does. (What such a heap made writable already stays
    usable, and was counted: kilobytes, for the grader's threads.)"""
    try:
        with open("/proc/self/maps", encoding="ascii", errors="replace") as maps:
            spans = [_span(line) for line in maps]
    except OSError:
        return
    for (start, end, access, anonymous), (reserve, reserve_end, reserve_access, reserve_anonymous) in (
            itertools.pairwise(spans)):
        if (anonymous and reserve_anonymous and access == "rw-p" and reserve_access == "---p"
                and start % _HEAP_SPAN == 0 and reserve == end and reserve_end == start + _HEAP_SPAN):
            _libc.munmap(ctypes.c_void_p(reserve), ctypes.c_size_t(reserve_end - reserve))


_HEAP_SPAN = 64 * 2**20  # a glibc thread heap's reserve, aligned to its size (64-bit systems)


def _span(line: str) -> tuple[int, int, str, bool]:
    """``(start, end, access, anonymous)`` of a line of /proc/self/maps."""
    fields = line.split()
    start, end = (int(bound, 16) for bound in fields[0].split("-"))
    return start, end, fields[1], len(fields) == 5


# -- Landlock -------------------------------------------------------------------

_libc = ctypes.CDLL(None, use_errno=True)
_libc.malloc.restype = ctypes.c_void_p  # an address, not the C int ctypes assumes
_libc.free.argtypes = [ctypes.c_void_p]
# Looked up once here: a worker forked later finds them ready.
_syscall, _prctl_call = _libc.syscall, _libc.prctl
_SYS_LANDLOCK = (444, 445, 446)  # create_ruleset, add_rule, restrict_self: the same on every architecture
_CREATE_RULESET_VERSION = 1
_RULE_PATH_BENEATH = 1

# Filesystem rights, by the ABI that introduced them.
_EXECUTE, _WRITE_FILE, _READ_FILE, _READ_DIR = 1 << 0, 1 << 1, 1 << 2, 1 << 3
_REMOVE_DIR, _REMOVE_FILE, _MAKE_CHAR, _MAKE_DIR = 1 << 4, 1 << 5, 1 << 6, 1 << 7
_MAKE_REG, _MAKE_SOCK, _MAKE_FIFO, _MAKE_BLOCK, _MAKE_SYM = 1 << 8, 1 << 9, 1 << 10, 1 << 11, 1 << 12
_REFER, _TRUNCATE, _IOCTL_DEV = 1 << 13, 1 << 14, 1 << 15
_FS_BY_ABI = {1: (1 << 13) - 1, 2: (1 << 14) - 1, 3: (1 << 15) - 1, 4: (1 << 15) - 1, 5: (1 << 16) - 1}
_FILE_RIGHTS = _EXECUTE | _WRITE_FILE | _READ_FILE | _TRUNCATE | _IOCTL_DEV  # all a rule on a file may hold
_NET_TCP = 0b11  # bind and connect (ABI 4)
_SCOPES = 0b11  # abstract unix sockets and signals (ABI 6)

_READ = _READ_FILE | _READ_DIR
_READ_EXECUTE = _READ | _EXECUTE
# The scratch folder: everything but device nodes (root could make one for
# the raw disk there and read the course through it).
_SCRATCH = ((1 << 16) - 1) & ~(_MAKE_CHAR | _MAKE_BLOCK | _IOCTL_DEV)

# What every Python program may need, read-only (missing ones are skipped).
_SYSTEM_FOLDERS = ("/usr", "/lib", "/lib64", "/lib32", "/bin", "/sbin", "/etc", "/sys")
_PROC_FILES = ("/proc/cpuinfo", "/proc/meminfo", "/proc/stat", "/proc/filesystems")
_DEVICES = {"/dev/null": _READ_FILE | _WRITE_FILE, "/dev/zero": _READ_FILE | _WRITE_FILE,
            "/dev/full": _READ_FILE | _WRITE_FILE, "/dev/urandom": _READ_FILE, "/dev/random": _READ_FILE}
_GPU_DEVICE_PREFIX = "nvidia"  # /dev/nvidia0, /dev/nvidiactl, /dev/nvidia-uvm: CUDA opens and drives them


class _RulesetAttr(ctypes.Structure):
    _fields_ = [("handled_access_fs", ctypes.c_uint64), ("handled_access_net", ctypes.c_uint64),
                ("scoped", ctypes.c_uint64)]


class _PathBeneathAttr(ctypes.Structure):
    _pack_ = 1
    _fields_ = [("allowed_access", ctypes.c_uint64), ("parent_fd", ctypes.c_int32)]


def landlock_abi() -> int:
    """The kernel's Landlock ABI version; 0 where it has none (or is not Linux)."""
    if sys.platform != "linux":
        return 0
    version = _syscall(_SYS_LANDLOCK[0], None, ctypes.c_size_t(0), ctypes.c_uint32(_CREATE_RULESET_VERSION))
    return max(version, 0)


def python_folders(protected: Path) -> tuple[str, ...]:
    """The folders Python and its packages load from: the prefixes, every
    folder on ``sys.path`` and ``LD_LIBRARY_PATH``, but none that holds
    ``protected`` (the course's own tree, on the path when the grader runs
    from it) and none inside it, save the interpreter's own (a virtual
    environment in the course's folder)."""
    prefixes = {Path(p).resolve() for p in (sys.prefix, sys.base_prefix, sys.exec_prefix, sys.base_exec_prefix)}
    candidates = set(prefixes)
    for entry in [*sys.path, *os.environ.get("LD_LIBRARY_PATH", "").split(os.pathsep)]:
        if entry:
            candidates.add(Path(entry).resolve())
    protected = protected.resolve()
    kept = []
    for folder in sorted(candidates):
        holds = protected == folder or protected.is_relative_to(folder)
        inside = folder.is_relative_to(protected) and not any(folder.is_relative_to(p) for p in prefixes)
        if folder.exists() and not holds and not inside:
            kept.append(str(folder))
    return tuple(kept)


def fixed_rules(policy: Policy) -> tuple[tuple[str, int], ...]:
    """The Landlock rules every worker of ``policy`` shares, ``(path, rights)``,
    worked out once in the grader: what Python needs, read-only; the staged
    submissions; a few device files. Missing paths are left out, and a rule
    on a file holds only the rights a file can have."""
    rules = [(folder, _READ_EXECUTE) for folder in (*_SYSTEM_FOLDERS, *policy.python)]
    rules += [(path, _READ) for path in policy.readable]
    rules += [(path, _READ_FILE) for path in _PROC_FILES]
    rules += list(_DEVICES.items())
    with contextlib.suppress(OSError):
        rules += [(f"/dev/{name}", _READ_FILE | _WRITE_FILE | _IOCTL_DEV)
                  for name in sorted(os.listdir("/dev")) if name.startswith(_GPU_DEVICE_PREFIX)]
    return tuple((path, rights if os.path.isdir(path) else rights & _FILE_RIGHTS)
                 for path, rights in rules if os.path.exists(path))


def _landlock(scratch: Path, policy: Policy) -> bool:
    """Restrict this process's filesystem, network and scopes; True once in force."""
    abi = landlock_abi()
    fs = _FS_BY_ABI.get(abi, (1 << 16) - 1)
    attr = _RulesetAttr(fs, _NET_TCP if abi >= 4 else 0, _SCOPES if abi >= 6 else 0)
    size = 24 if abi >= 6 else 16 if abi >= 4 else 8  # the structure grew with the ABI
    ruleset = _syscall(_SYS_LANDLOCK[0], ctypes.byref(attr), ctypes.c_size_t(size), ctypes.c_uint32(0))
    if ruleset < 0:
        return False
    try:
        own = ((str(scratch), _SCRATCH), (f"/proc/{os.getpid()}", _READ))
        for path, rights in (*own, *policy.rules):
            _add_rule(ruleset, path, rights & fs)
        return _syscall(_SYS_LANDLOCK[2], ctypes.c_int(ruleset), ctypes.c_uint32(0)) == 0
    finally:
        os.close(ruleset)


def _add_rule(ruleset: int, path: str, rights: int) -> None:
    """Allow ``rights`` beneath ``path``; a path that has gone is skipped."""
    try:
        fd = os.open(path, os.O_PATH | os.O_CLOEXEC)
    except OSError:
        return
    try:
        attr = _PathBeneathAttr(rights, fd)
        _syscall(_SYS_LANDLOCK[1], ctypes.c_int(ruleset), ctypes.c_int(_RULE_PATH_BENEATH),
                 ctypes.byref(attr), ctypes.c_uint32(0))
    finally:
        os.close(fd)


# -- seccomp --------------------------------------------------------------------

_PR_SET_PDEATHSIG, _PR_SET_NO_NEW_PRIVS, _PR_GET_SECCOMP, _PR_SET_SECCOMP = 1, 38, 21, 22
_SECCOMP_MODE_FILTER = 2
_CLONE_THREAD = 0x00010000
_ALLOW = 0x7FFF0000
_ERRNO = 0x00050000  # | errno

# Per architecture: its audit id, ``clone``, ``clone3``, ``prlimit64`` and the calls refused
# outright: fork, vfork, socket, socketpair, ptrace, unshare, setns, mount, umount2,
# pivot_root, process_vm_readv and _writev, bpf, io_uring_setup (its requests would skip
# this filter); execve and execveat (a worker never needs a new program); setrlimit (the
# limits a worker was given are the ones it keeps, even as root).
_ARCHITECTURES = {
    "x86_64": (0xC000003E, 56, 435, 302, (57, 58, 41, 53, 101, 272, 308, 165, 166, 155, 310, 311, 321, 425,
                                          59, 322, 160)),
    "aarch64": (0xC00000B7, 220, 435, 261, (198, 199, 117, 97, 268, 40, 39, 41, 270, 271, 280, 425,
                                           221, 281, 164)),
}
_X32_BIT = 0x40000000  # x86-64's other system call table: refused whole
_NEW_LIMIT = 16 + 2 * 8  # prlimit64's third argument in seccomp_data, its low half first (little-endian)


def _seccomp_program() -> bytes | None:
    """The classic-BPF filter for this architecture, or None where there is none."""
    found = _ARCHITECTURES.get(platform.machine().lower()) if sys.platform == "linux" else None
    if found is None:
        return None
    arch, clone, clone3, prlimit, refused = found
    code: list[tuple[int, int, int, int]] = []  # (op, jump if true, jump if false, k)
    load, jeq, jset, ret = 0x20, 0x15, 0x45, 0x06
    # Labels are resolved at the end: jumps are counted from the next instruction.
    code.append((load, 0, 0, 4))  # the architecture
    code.append((jeq, 1, 0, arch))
    code.append((ret, 0, 0, _ERRNO | errno.EPERM))
    code.append((load, 0, 0, 0))  # the system call's number
    code.append((jset, 0, 1, _X32_BIT))
    code.append((ret, 0, 0, _ERRNO | errno.EPERM))
    # clone3's flags sit in memory a filter cannot read: ENOSYS makes the C
    # library fall back to clone, whose flags it can.
    code.append((jeq, 0, 1, clone3))
    code.append((ret, 0, 0, _ERRNO | errno.ENOSYS))
    for number in refused:
        code.append((jeq, 0, 1, number))
        code.append((ret, 0, 0, _ERRNO | errno.EPERM))
    # prlimit64 reads a limit with a null new value (glibc's getrlimit), and sets one without.
    code.append((jeq, 0, 6, prlimit))
    code.append((load, 0, 0, _NEW_LIMIT))
    code.append((jeq, 0, 3, 0))
    code.append((load, 0, 0, _NEW_LIMIT + 4))
    code.append((jeq, 0, 1, 0))
    code.append((ret, 0, 0, _ALLOW))
    code.append((ret, 0, 0, _ERRNO | errno.EPERM))
    code.append((jeq, 1, 0, clone))
    code.append((ret, 0, 0, _ALLOW))
    code.append((load, 0, 0, 16))  # clone's flags: the low half of its first argument
    code.append((jset, 0, 1, _CLONE_THREAD))  # a thread: allowed; a process: refused
    code.append((ret, 0, 0, _ALLOW))
    code.append((ret, 0, 0, _ERRNO | errno.EPERM))
    return b"".join(struct.pack("=HBBI", *instruction) for instruction in code)


class _SockFprog(ctypes.Structure):
    _fields_ = [("len", ctypes.c_ushort), ("filter", ctypes.c_void_p)]


_PROGRAM = _seccomp_program()


def _seccomp() -> bool:
    """Install the filter (after no_new_privs); True once in force."""
    program = _PROGRAM
    if program is None:
        return False
    buffer = ctypes.create_string_buffer(program, len(program))
    fprog = _SockFprog(len(program) // 8, ctypes.cast(buffer, ctypes.c_void_p))
    return _prctl(_PR_SET_SECCOMP, _SECCOMP_MODE_FILTER, ctypes.addressof(fprog)) == 0


def _prctl(option: int, *args: int) -> int:
    """prctl(2); -1 where it fails or the system has none."""
    if sys.platform != "linux":
        return -1
    values = [ctypes.c_ulong(value) for value in args] + [ctypes.c_ulong(0)] * (4 - len(args))
    return _prctl_call(ctypes.c_int(option), *values)
