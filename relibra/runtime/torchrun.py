"""torchrun with the kit's one-line failures: `python -m relibra.runtime.torchrun [torchrun's arguments]`.

It takes torchrun's own arguments and runs torchrun's own launcher (torch.distributed.run). What it
changes is how a failure ends: torchrun raises ChildFailedError and prints its traceback and a
failure report after a rank's own `error:` line; here the agent's log lines are silenced and the
failure ends as one line, or none where the rank has already printed its line (exit code 2, the
kit's code for a clean error).
"""

from __future__ import annotations

import logging
import signal
import sys

from torch.distributed import run as torch_run
from torch.distributed.elastic.multiprocessing.errors import ChildFailedError

CLEAN_ERROR_EXIT = 2  # `relibra run --torchrun` exits with 2 after printing its one `error:` line


def main(argv: list[str] | None = None) -> int:
    for name in list(logging.root.manager.loggerDict):
        if name.startswith("torch.distributed"):
            logging.getLogger(name).setLevel(logging.CRITICAL)
    args = torch_run.parse_args(argv)
    try:
        torch_run.run(args)
    except ChildFailedError as exc:
        rank, failure = exc.get_first_failure()
        if failure.exitcode == CLEAN_ERROR_EXIT:
            return CLEAN_ERROR_EXIT
        if failure.exitcode < 0:
            try:
                cause = f"killed by signal {signal.Signals(-failure.exitcode).name}"
            except ValueError:
                cause = f"killed by signal {-failure.exitcode}"
        else:
            cause = f"exited with code {failure.exitcode}"
        print(f"error: rank {rank} {cause}; torchrun stopped the other ranks", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
