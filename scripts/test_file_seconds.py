"""Write tests/file_seconds.json, each test file's measured seconds, from a CALLQA_TEST_CPU log.

`make test` hands test files to its processes longest first (tests/conftest.py reads this file), so the
suite does not end with one process running the slow worker files alone. Refresh it when files are added
or their times change much:

    CALLQA_TEST_CPU=/tmp/cpu.jsonl make test && python scripts/test_file_seconds.py /tmp/cpu.jsonl
"""

from __future__ import annotations

import json
import sys
from collections import defaultdict
from pathlib import Path

OUT = Path(__file__).resolve().parents[1] / "tests" / "file_seconds.json"


def main(log: str) -> None:
    seconds: dict[str, float] = defaultdict(float)
    for line in Path(log).read_text().splitlines():
        row = json.loads(line)
        seconds[row["test"].split("::")[0]] += row["wall_s"]
    ordered = dict(sorted(((f, round(s, 1)) for f, s in seconds.items()), key=lambda fs: (-fs[1], fs[0])))
    OUT.write_text(json.dumps(ordered, indent=1) + "\n")
    print(f"{len(ordered)} files, {sum(ordered.values()):.0f} s in all -> {OUT}")


if __name__ == "__main__":
    main(sys.argv[1])
