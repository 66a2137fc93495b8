"""Start-up: a command's options are taken without pydantic (typer 0.29 builds a pydantic adapter per option), and
every value comes out as typer's own coercion gives it, its error messages included."""


import pytest
import typer

from mtpcli.cli import app
from mtpcli.options import Plain
from test_startup import probe


@pytest.mark.slow
def test_generate_imports_no_pydantic(tiny_paths):
    code, out, _, modules = probe("generate", "-m", tiny_paths["target"], "--max-tokens", "2", "-p", "hi", "-q",
                                  "--batch-size", "1", "--temp", "0.5")
    assert code == 0 and out and "pydantic" not in modules
    code, _, _, modules = probe("generate", "--max-tokens", "x")  # a bad value: typer's own coercion says why
    assert code == 2 and "pydantic" in modules


VALUES = ["5", "-3", "0", "007", "+4", " 4", "1.5", "-0.25", "2.", ".5", "1e3", "inf", "x", "", "1_000"]


def typer_s(param, value):
    param._runtime_param = None
    try:
        return param.get_runtime_param().coerce(value, param=param, ctx=None)
    except typer.BadParameter as e:
        return ("error", e.format_message())


def test_plain_values_come_out_as_typer_s_own():
    command = typer.main.get_command(app)
    params = {}
    for sub in [command, *command.commands.values()]:
        for p in sub.params:
            params.setdefault((repr(p.type_descriptor.annotation), p.type_descriptor.parameter_info.min,
                               p.multiple, p.nargs), p)
    assert len(params) >= 6  # str, int, int with a minimum, float, bool, lists of str
    checked = 0
    for p in params.values():
        for value in [*VALUES, None, 3, 2.5, True, ("a", "b"), ()]:
            mine = Plain()
            try:
                got = mine.coerce(value, p, None)
            except typer.BadParameter as e:
                got = ("error", e.format_message())
            assert got == typer_s(p, value) and type(got) is type(typer_s(p, value)), (p.name, value)
            checked += 1
    assert checked > 100
