"""Several processes under `mlx.launch` (`mtpcli launch`), over mx.distributed alone (docs/architecture.md)."""

from .group import Group, Solo, Watchdog, describe, launched, refuse_stdin, setup  # noqa: F401
