"""``python -m pipeline.bench.store_fault FILE worker ...``: `callqa worker ...` whose store refuses every
insert while FILE exists, as a ClickHouse server that stopped answering would.

How the chaos benchmark and the tests take a worker's store away for a while: an embedded store has no
server to stop, and the product keeps no test hook for it. The worker's own sink is unchanged: it retries a
refused insert as any failed one (and logs it with "test fault:", which the chaos run counts), so what the
run measures is the worker's real recovery. ``WorkerProcess(fault_file=...)`` starts workers this way.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

from pipeline.store.sink import ClickHouseSink


def refuse_inserts_while(fault_file: Path) -> None:
    """Make every sink of this process refuse its inserts while ``fault_file`` exists."""
    insert = ClickHouseSink._insert

    def refusing(sink: ClickHouseSink, chunk: Any) -> None:
        if fault_file.exists():
            raise ConnectionRefusedError(f"store refused the insert (test fault: {fault_file} exists)")
        insert(sink, chunk)

    ClickHouseSink._insert = refusing  # type: ignore[method-assign,assignment]


def main() -> None:
    if len(sys.argv) < 3:
        sys.exit("usage: python -m pipeline.bench.store_fault FAULT_FILE worker [options]")
    refuse_inserts_while(Path(sys.argv[1]))
    from pipeline.cli import main as callqa

    sys.argv = ["callqa", *sys.argv[2:]]
    callqa()


if __name__ == "__main__":
    main()
