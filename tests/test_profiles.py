"""TOML profiles: schema, shipped files, precedence, errors."""

from pathlib import Path

import pytest

from mtpcli import config as profiles
from mtpcli.errors import UsageError
from mtpcli.config import SCHEMA

ROOT = Path(__file__).resolve().parents[1]


def markdown_table() -> str:
    """The README's table of profile keys, generated from the schema (paste it there when the schema changes)."""
    lines = ["| key | flag | environment | type | default | allowed | meaning |", "|---|---|---|---|---|---|---|"]
    for k in SCHEMA.values():
        default = "" if k.default is None else str(k.default).lower() if isinstance(k.default, bool) else str(k.default)
        lines.append(f"| `{k.name}` | `{k.option}` | `{k.env}` | {k.type.__name__} | {default} | {k.allowed} | {k.help} |")
    return "\n".join(lines)


def test_every_shipped_profile_loads_validates_and_says_what_it_is_for():
    names = set(profiles.available())
    assert {"exact", "typical-0.09", "typical-0.20", "adaptive", "fixed-4", "agent-json", "ngram"} <= names
    for name, path in profiles.available().items():
        p = profiles.load(name)
        first = path.read_text().splitlines()[0]
        assert first.startswith("#") and p.description
        if p.values.get("typical_threshold"):
            assert "NOT distribution-exact" in path.read_text()


def test_default_profile_is_exact_and_leaves_typical_off():
    s = profiles.resolve(None, {}, env={})
    assert s.profile == "exact" and s.typical_threshold == 0.0
    assert s.n_max == 8 and not s.pinned  # draft = auto chooses the width: up to 8
    assert profiles.load("adaptive").values["n_min"] == 3 and profiles.load("adaptive").values["n_max"] == 7


def test_precedence_flag_over_env_over_profile_over_default():
    env = {"MTPCLI_TEMP": "0.5", "MTPCLI_TOP_K": "7"}
    s = profiles.resolve("typical-0.09", {"temp": 0.9}, env=env)
    assert s.temp == 0.9 and s.origins["temp"] == "flag"
    assert s.top_k == 7 and s.origins["top_k"] == "env MTPCLI_TOP_K"
    assert s.top_p == 0.95 and s.origins["top_p"].endswith("typical-0.09.toml")
    assert s.min_p == 0.0 and s.origins["min_p"] == "default"


def test_env_selects_profile_and_flag_profile_wins(udir):
    assert profiles.resolve(None, {}, env={"MTPCLI_PROFILE": "adaptive"}).profile == "adaptive"
    assert profiles.resolve("fixed-4", {}, env={"MTPCLI_PROFILE": "adaptive"}).profile == "fixed-4"


def test_profile_use_persists_and_profile_flag_overrides(udir):
    profiles.set_default("typical-0.20")
    assert profiles.resolve(None, {}, env={}).profile == "typical-0.20"
    assert profiles.resolve("exact", {}, env={}).profile == "exact"
    assert profiles.resolve(None, {}, env={"MTPCLI_PROFILE": "adaptive"}).profile == "adaptive"


def test_user_profile_extends_shipped(udir):
    (udir / "mine.toml").write_text('# mine\nextends = "typical-0.09"\nseed = 4\n')
    s = profiles.resolve("mine", {}, env={})
    assert s.typical_threshold == 0.09 and s.seed == 4 and s.temp == 1.0


def test_n_max_defaults_to_width():
    assert profiles.resolve(None, {"num_draft_tokens": 6}, env={}).n_max == 6


def err(udir, text, name="bad"):
    (udir / f"{name}.toml").write_text(text)
    with pytest.raises(UsageError) as e:
        profiles.resolve(name, {}, env={})
    msg = str(e.value)
    assert "\n" not in msg
    return msg


def test_syntax_error_names_file_and_line(udir):
    msg = err(udir, "temp = 0.5\ntop_p = = 3\n")
    assert "bad.toml" in msg and "line 2" in msg


def test_unknown_key_suggests_nearest(udir):
    msg = err(udir, "temperature = 0.5\n")
    assert "unknown key 'temperature'" in msg and "did you mean 'temp'" in msg


def test_wrong_type_and_range(udir):
    msg = err(udir, 'description = "x"\ntemp = 0.5\ntop_k = "five"\n')
    assert "bad.toml:3:" in msg and "top_k" in msg and "'five'" in msg and "int" in msg  # names the line
    msg = err(udir, "top_p = 1.5\n")
    assert "top_p = 1.5" in msg and "(0, 1]" in msg


def test_a_profile_saved_with_a_byte_order_mark_loads(udir):
    (udir / "bom.toml").write_bytes("\ufeff".encode() + b'description = "saved by an editor"\ntemp = 0.5\n')
    assert profiles.load("bom").values == {"temp": 0.5}


@pytest.mark.parametrize("raw", ["inf", "-inf", "nan"])
def test_non_finite_floats_are_refused(raw):
    with pytest.raises(UsageError, match="temp"):
        profiles.resolve(None, {"temp": float(raw)})
    with pytest.raises(UsageError, match="MTPCLI_TOP_P"):
        profiles.resolve(None, {}, env={"MTPCLI_TOP_P": raw})


def test_n_min_above_n_max_refused(udir):
    msg = err(udir, "n_min = 5\nn_max = 3\n")
    assert "n_min (5) must not exceed n_max (3)" in msg


def test_unknown_profile_lists_known():
    with pytest.raises(UsageError, match="known profiles: .*exact"):
        profiles.resolve("nope", {}, env={})


def test_extends_cycle_refused(udir):
    (udir / "a.toml").write_text('extends = "b"\n')
    (udir / "b.toml").write_text('extends = "a"\n')
    with pytest.raises(UsageError, match="cycle"):
        profiles.resolve("a", {}, env={})


def test_bad_env_value_names_variable():
    with pytest.raises(UsageError, match="MTPCLI_TYPICAL_THRESHOLD"):
        profiles.resolve(None, {}, env={"MTPCLI_TYPICAL_THRESHOLD": "-1"})
    with pytest.raises(UsageError, match="MTPCLI_TOP_K"):
        profiles.resolve(None, {}, env={"MTPCLI_TOP_K": "x"})


def test_readme_table_and_help_follow_the_schema(cli):
    readme = (ROOT / "README.md").read_text()
    assert markdown_table() in readme
    helptext = cli("generate", "--help", env={"COLUMNS": "300"}).stdout.decode()
    for key in SCHEMA.values():
        assert key.option in helptext, key.option


def test_profile_commands(cli, udir):
    env = {"MTPCLI_PROFILE_DIR": str(udir)}
    out = cli("profile", "list", env=env).stdout.decode()
    assert "* exact" in out and "typical-0.09" in out
    assert cli("profile", "use", "adaptive", env=env).returncode == 0
    assert "* adaptive" in cli("profile", "list", env=env).stdout.decode()
    show = cli("profile", "show", "--origin", env=env).stdout.decode()
    assert "# profile: adaptive" in show and "adaptive.toml" in show
    show = cli("--profile", "fixed-4", "profile", "show", env=env).stdout.decode()
    assert "# profile: fixed-4" in show
    (udir / "broken.toml").write_text("temp = \n")
    r = cli("profile", "validate", env=env)
    assert r.returncode == 2 and "broken" in r.stderr.decode() and "ok      exact" in r.stdout.decode()
    r = cli("profile", "use", "nope", env=env)
    assert r.returncode == 2 and "known profiles" in r.stderr.decode()
    assert str(udir) in cli("profile", "path", env=env).stdout.decode()
