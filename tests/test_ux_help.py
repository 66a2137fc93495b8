"""The help and the small conveniences of the command line (issue 32): readable help at 80 columns, the usage
line's program name, --version, -h, shell completion, the prompt as an argument."""

import re
from importlib.metadata import version

from mtpcli import options
from mtpcli.config import SCHEMA


def _entries(helptext: str) -> dict[str, str]:
    """The help's option entries: their names -> the whole entry (names and help), its whitespace collapsed."""
    entries: dict[str, str] = {}
    current = None
    for line in helptext.splitlines():
        if re.match(r"^  -", line):
            current = line.strip()
            entries[current] = ""
        elif current is not None and line.startswith("    "):
            entries[current] += " " + line.strip()
        else:
            current = None
    return {re.split(r" <| {2,}", k)[0]: " ".join((k + v).split()) for k, v in entries.items()}


def test_80_column_help_cuts_no_option_name_and_shows_each_default_and_choices(cli):
    helptext = cli("generate", "--help", env={"COLUMNS": "80"}).stdout.decode()
    assert "…" not in helptext and max(map(len, helptext.splitlines())) <= 80
    entries = _entries(helptext)
    for key in SCHEMA.values():
        mine = [e for names, e in entries.items() if key.option in re.split(r"[ ,/]+", names)]
        assert len(mine) == 1, key.option  # the whole name, in one entry
        if key.allowed:
            assert f"[{key.allowed}" in mine[0], (key.option, mine[0])
        if key.default is not None:
            shown = ("on" if key.default else "off") if key.type is bool else key.default
            assert f"default: {shown}]" in mine[0], (key.option, mine[0])
    for panel in options.PANELS:  # options grouped in sections
        assert f"\n{panel}:\n" in helptext, panel


def test_usage_line_says_mtpcli_not_python_m(cli):
    for args in (("generate", "--help"), ("--help",), ("profile", "--help")):
        out = cli(*args).stdout.decode()
        assert re.search(r"Usage: mtpcli\b", out) and "python -m" not in out, args


def test_version_prints_the_package_version_on_stdout(cli):
    r = cli("--version")
    assert r.returncode == 0 and r.stdout.decode() == f"mtpcli {version('mtpcli')}\n" and not r.stderr


def test_h_is_help_on_every_command(cli):
    for args in ((), ("generate",), ("stats",), ("bench",), ("launch",), ("convert",), ("profile",),
                 ("profile", "show"), ("models",), ("models", "list"), ("history",), ("history", "stats")):
        r = cli(*args, "-h")
        assert r.returncode == 0 and r.stdout.decode().startswith(" ".join(("Usage: mtpcli", *args, "["))), args
    assert cli("generate", "-h").stdout == cli("generate", "--help").stdout


def test_completion_options_exist_and_no_args_still_prints_help(cli):
    top = cli("--help").stdout.decode()
    assert "--install-completion" in top and "--show-completion" in top
    r = cli("--show-completion", "bash", env={"SHELL": "/bin/bash"})
    assert r.returncode == 0 and b"_MTPCLI_COMPLETE" in r.stdout
    r = cli(env={"_MTPCLI_COMPLETE": "complete_bash", "COMP_WORDS": "mtpcli gen", "COMP_CWORD": "1"})
    assert r.returncode == 0 and r.stdout.decode().split() == ["generate"]
    r = cli()  # no command: the help on stdout, as before, and no error line
    assert r.returncode == 2 and r.stdout.decode().startswith("Usage: mtpcli") and not r.stderr


def test_positional_prompt_works_like_p(cli, tiny_paths):
    common = ("-m", tiny_paths["target"], "--max-tokens", "8", "--no-chat", "-q", "--no-log")
    by_arg = cli("generate", "abcabc", *common)
    by_flag = cli("generate", "-p", "abcabc", *common)
    assert by_arg.returncode == 0, by_arg.stderr.decode()
    assert by_arg.stdout == by_flag.stdout and by_arg.stdout


def test_prompt_argument_and_p_together_is_one_error_line(cli, tiny_paths):
    r = cli("generate", "one", "-p", "two", "-m", tiny_paths["target"], "--max-tokens", "4")
    lines = r.stderr.decode().splitlines()
    assert r.returncode == 2 and not r.stdout and len(lines) == 1, r.stderr.decode()
    assert lines[0].startswith("mtpcli: error: ") and "-p/--prompt" in lines[0] and "PROMPT" in lines[0]
