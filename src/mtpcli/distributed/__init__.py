"""Several processes under `mlx.launch` (`mtpcli launch`), over mx.distributed alone. `--distributed` (`auto`: data
with several requests, else tensor): data.py decodes a share of the requests on each rank, sharded.py shards the
target (tensor, pipeline); group.py finds and watches the group; launch.py and rank.py start the ranks."""

from .group import Group, Solo, Watchdog, describe, launched, refuse_stdin, setup  # noqa: F401
