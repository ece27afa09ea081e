"""What every ``mha-course`` command shares: the typer app they register
on, the command class that writes their help, the consoles, and the one
way a command refuses what it was asked (``usage_error``: one red line on
stderr, exit status 2). The student's commands are in ``grader.cli``, the
instructor's in ``grader.instructor_commands``; both import this module,
and neither imports the other but ``cli``, which registers them all.
"""

from __future__ import annotations

import copy
import enum
import os
from typing import Annotated, NoReturn

import typer
from rich.console import Console
from rich.markup import escape
from typer.core import TyperArgument, TyperCommand, TyperGroup

from grader.catalog import is_student_edition

# The student edition shows a student's commands only; the instructor's are
# answered with one line (main), since they need solutions/ or tests/.
INSTRUCTOR_COMMANDS = ("verify", "batch", "release", "gradescope", "build", "new-chapter")


class _PlainHelp:
    """Help that names what a student types. typer shows a type for every
    value, a flag's too: ``--json <bool>`` reads as if ``--json true`` were
    how to write it, and that is an error (``true`` is taken for a target);
    and it writes an argument ``{submissions}`` or ``[targets]...`` over
    ``<list[str]>``. A flag shows no value here, an argument its name in
    capitals (``SUBMISSIONS``, ``[TARGETS]...``), as its help text names it."""

    def get_params(self, ctx):
        params = super().get_params(ctx)
        for param in params:
            if getattr(param, "is_flag", False):
                param.metavar = ""  # shown instead of the type
            elif isinstance(param, TyperArgument) and param.metavar is None:
                param.metavar = param.name.upper() + ("..." if param.nargs != 1 else "")
                # Its name and help say what it is: no type beside it, neither
                # as typer 0.29 shows one (display_type_rich) nor as 0.27 and
                # 0.28 do (the click type's metavar, else <its name>).
                param.display_type_rich = lambda ctx: ""
                if hasattr(param, "type"):  # typer before 0.29
                    param.type = copy.copy(param.type)  # click's STRING is everyone's
                    param.type.get_metavar = lambda *args, **kwargs: ""
        return params


class Command(_PlainHelp, TyperCommand):
    """Every command of ``mha-course`` (``cls=`` of ``app.command``)."""

    def collect_usage_pieces(self, ctx) -> list[str]:
        pieces = [self.options_metavar] if self.options_metavar else []
        for param in self.get_params(ctx):
            if isinstance(param, TyperArgument):
                pieces.append(param.metavar if param.required else f"[{param.metavar}]")
            else:
                pieces += param.get_usage_pieces(ctx)
        return pieces


class Group(_PlainHelp, TyperGroup):
    """``mha-course`` itself, whose ``--help`` is a flag too."""


app = typer.Typer(
    help="Grade the exercises of the attention course." if is_student_edition() else
    "Grade the exercises of the attention course, and build them from the solutions.",
    add_completion=False,
    pretty_exceptions_enable=False,
    cls=Group,
)
student_command = app.command(cls=Command)
instructor_command = app.command(hidden=is_student_edition(), cls=Command)  # hidden in the edition
stdout = Console()
stderr = Console(stderr=True)

USAGE_ERROR = 2
INTERRUPTED = 130


def usage_error(message: str) -> NoReturn:
    stderr.print(f"[bold red]error:[/] {escape(message)}", highlight=False, soft_wrap=True)
    raise typer.Exit(USAGE_ERROR)


class Device(str, enum.Enum):
    cpu = "cpu"
    cuda = "cuda"
    auto = "auto"


# Given to the commands that grade on a device of the user's choice: grade, watch, verify.
Where = Annotated[Device, typer.Option(help="Where the checks run.")]


def chosen_device(choice: Device):
    """The ``torch.device`` that ``--device`` names; cuda where there is no
    CUDA is a usage error."""
    # Ask NVML, not the CUDA runtime: the grader must not initialise CUDA
    # before it forks workers, which initialise it themselves.
    os.environ.setdefault("PYTORCH_NVML_BASED_CUDA_CHECK", "1")
    import torch

    if choice is Device.cpu:
        return torch.device("cpu")
    if torch.cuda.is_available():
        return torch.device("cuda")
    if choice is Device.auto:
        return torch.device("cpu")
    usage_error(f"--device cuda: CUDA is not available here (torch {torch.__version__}); "
                "use --device cpu or auto")


# Given to every command that grades.
Timeout = Annotated[float, typer.Option(
    metavar="<seconds>", min=0.1,
    help="Seconds of CPU time one check may take; an exercise may take four times that.")]
