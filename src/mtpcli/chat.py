"""`mtpcli chat`: a turn per line of stdin through generate.run, the models loaded once (models.KEPT) and
each model's prefill kept in memory at the last chunk boundary (prefix.MEMORY); README.md, Conversations."""

from __future__ import annotations

import sys

from . import models, prefix, runlog
from .conversation import Conversation
from .errors import EXIT_INTERRUPTED, MtpError
from .tables import status as working
from .prompts import Item, decode

HELP = ("/stats: the last turn's statistics; /reset: a new conversation; /save: keep it for `mtpcli generate -c` "
        "(the later turns too); /quit (or Ctrl-D): end")


def err(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


def loop(cfg, conv: Conversation | None, argv: tuple, log: bool, log_prompts: bool) -> int:
    """Read turns and commands until /quit or the end of stdin; the exit status: 0, or the last failed turn's."""
    from . import generate
    from .distributed.group import launched
    from .tables import render

    if launched():  # (every rank would read the one stdin, which the launcher does not pass on)
        raise MtpError("chat does not run under mtpcli launch / mlx.launch: use generate there")
    if cfg.format != "text":
        raise MtpError(f"--format {cfg.format}: chat writes text (`mtpcli generate` writes json and jsonl)")
    tty = sys.stdin.isatty()
    fresh = lambda: Conversation(None, models.canonical(cfg.model), cfg.system, kept=False)  # noqa: E731
    conv, turn, worst, line_no = conv or fresh(), {}, 0, 0
    models.KEPT, prefix.MEMORY = {}, {}
    with working(f"loading target model {cfg.model} ...", False):
        target = models.load(cfg.model, "target model")  # (now, not in the first turn; one that cannot load ends here)
    if not (generate.chat_on(target.tokenizer, cfg.chat) and target.tokenizer.has_chat_template):
        raise MtpError("chat needs the model's chat template: " + ("--no-chat is set" if cfg.chat is False else
                                                                  "its tokenizer has none"))
    if tty:
        err(f"mtpcli chat · {cfg.model} · {HELP}")
    while True:
        try:
            if tty:
                print(">>> ", end="", file=sys.stderr, flush=True)
            data = sys.stdin.buffer.readline()
        except KeyboardInterrupt:
            err("\n(/quit or Ctrl-D ends the session)")
            continue
        if not data:
            break
        line_no += 1
        text = decode(data, f"stdin line {line_no}").rstrip("\r\n")
        command = text.strip()
        if not command:
            continue
        if command.startswith("/"):
            if command in ("/quit", "/exit", "/bye"):
                break
            if command == "/reset":
                conv, turn = fresh(), {}
                prefix.MEMORY.clear()
                err("mtpcli: a new conversation")
            elif command == "/stats":
                render(turn["record"], sys.stderr, sys.stderr.isatty(), title=f"mtpcli · {cfg.profile} · {cfg.law}") \
                    if turn else err("mtpcli: no answer yet")
            elif command == "/save":
                if not log or runlog.disabled():
                    err("mtpcli: /save: a conversation is kept in the run log, which " +
                        ("--no-log" if not log else "MTPCLI_NO_LOG") + " turns off")
                else:
                    try:
                        err(f"mtpcli: saved as conversation {conv.save()}; `mtpcli generate -c` goes on from it")
                    except MtpError as e:
                        err(f"mtpcli: error: {e}")
            else:
                err(f"mtpcli: {'' if command == '/help' else f'unknown command {command}; '}{HELP}")
            continue
        opts = generate.Options(quiet=True, argv=argv, log=log, log_prompts=log_prompts, conversation=conv, turn=turn)
        try:
            status = generate.run(cfg, [Item(0, "stdin" if not tty else "chat", text)], opts)
        except KeyboardInterrupt:  # (after the answer: its run log row, its turn)
            status = EXIT_INTERRUPTED
            err("mtpcli: interrupted")
        except MtpError as e:  # a turn that cannot be used (too long for the context): the session goes on
            err(f"mtpcli: error: {e}")
            status = e.exit_code
        worst = status if status not in (0, EXIT_INTERRUPTED) else worst
    return worst

