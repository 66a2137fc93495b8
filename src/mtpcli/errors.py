"""User-facing failures: one clear line on stderr and a documented exit code, never a traceback."""

# Exit codes (documented in the README).
EXIT_RUNTIME = 1  # an unexpected failure while decoding
EXIT_USAGE = 2  # bad input: a flag, a profile, a prompt
EXIT_MODEL = 3  # a model could not be found, fetched, converted or paired with its draft
EXIT_INTERRUPTED = 130  # Ctrl-C: what was committed is printed, then the statistics so far
EXIT_TERMINATED = 143  # SIGTERM (128 + 15): ends a run like Ctrl-C
EXIT_PIPE = 141  # stdout was closed by the reader (e.g. `| head -c 10`)
EXIT_IO = 74  # stdout could not be written (a full disk, /dev/full): sysexits' EX_IOERR


class MtpError(Exception):
    """An error a user can act on. The message is one line; it names the flag, key or file."""

    exit_code = EXIT_USAGE

    def __init__(self, message: str, exit_code: int | None = None):
        super().__init__(message)
        self.exit_code = self.exit_code if exit_code is None else exit_code


class UsageError(MtpError):
    exit_code = EXIT_USAGE


class ModelError(MtpError):
    exit_code = EXIT_MODEL
