"""Issue 55 (tidy5): a small declared Drafter interface, its settings given when a drafter is made, and where a
setting came from read in config alone."""

import re
from pathlib import Path

from mtpcli import assemble, config, constrain, drafters, engine, models
from mtpcli.controller import FixedWidth
from mtpcli.drafters.model import ModelDrafter
from mtpcli.engine import DecodeConfig, Engine


def members(cls) -> set[str]:
    return {k for k in vars(cls) if not k.startswith("_")}


def test_the_drafter_protocol_declares_what_the_engine_asks_and_no_more():
    code = Path(engine.__file__).read_text()
    asked = set(re.findall(r"self\.drafter\.(\w+)", code)) | {"add_rows", "keep_rows"}  # (those two: every part's)
    assert re.search(r"for part in \(self\.target, self\.drafter", code)
    assert members(drafters.Drafter) == asked
    assert members(drafters.Source) == {"stops", "defer", "backlog", "available"}  # what draft = auto asks of its sources


def test_a_drafter_is_made_with_the_rows_constraints_and_the_engine_sets_none(tiny_paths, tiny):
    target, draft = tiny
    cfg = config.settle(config.resolve(None, {"model": str(tiny_paths["target"]), "draft_model":
                                              str(tiny_paths["draft"]), "draft": "model"}, env={}), False)
    eng = assemble.engine(cfg, models.load(str(tiny_paths["target"])), models.load(str(tiny_paths["draft"])))
    assert isinstance(eng.drafter, ModelDrafter) and eng.drafter.guide is eng.guide is not None
    guide = constrain.Guide(target.tokenizer, target.tokenizer.eos_token_ids, target.config["vocab_size"])
    made = ModelDrafter(draft.model)
    Engine(target.model, made, FixedWidth(2), target.tokenizer.eos_token_ids, DecodeConfig(), guide=guide)
    assert made.guide is None


def test_where_a_setting_came_from_names_its_flag_env_or_profile(tmp_path):
    (tmp_path / "p.toml").write_text('model = "x"\n')
    cfg = config.resolve(str(tmp_path / "p.toml"), {"system": "s"}, env={"MTPCLI_TEMP": "0.5"})
    assert (cfg.where("system"), cfg.where("temp"), cfg.where("model"), cfg.where("top_p")) == \
        ("--system", "env MTPCLI_TEMP", str(tmp_path / "p.toml"), "default")
