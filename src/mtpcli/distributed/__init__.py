"""Several processes under `mlx.launch` (`mtpcli launch`): mx.distributed only, no transport of our own.

Modes (`--distributed`; `auto`: `data` with several requests, else `tensor`): data (data.py: every rank decodes a
share of the requests, rank 0 gathers them), tensor and pipeline (sharded.py: the target sharded over the ranks,
the drafter on rank 0, one message a cycle). group.py finds the group and watches every wait on it; launch.py and
rank.py start the ranks and report the worst one's status."""

from .group import Group, Solo, Watchdog, describe, launched, refuse_stdin, setup  # noqa: F401
