"""Record a machine's raw fact outputs into a golden folder, plus the facts.json they produce.

    python -m ktdeploy.controller.facts_record tests/golden/NAME [--host H] [--path P ...]

Write SOURCE.md by hand next to it: where and how it was recorded.
"""

from __future__ import annotations

import argparse
import json

from ktdeploy.controller.connectors import connect
from ktdeploy.controller.facts_gather import gather_raw, save_raw
from ktdeploy.core.facts.assemble import build_facts
from ktdeploy.core.safeio import write_file


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m ktdeploy.controller.facts_record")
    ap.add_argument("folder")
    ap.add_argument("--host", default="localhost")
    ap.add_argument("--path", action="append", default=[])
    args = ap.parse_args(argv)
    conn = connect(args.host)
    try:
        raw = gather_raw(conn, args.path)
    finally:
        conn.close()
    save_raw(raw, args.folder)
    facts = build_facts(raw)
    write_file(args.folder, "facts.json", json.dumps(facts.model_dump(mode="json"), indent=2, sort_keys=True) + "\n",
               overwrite=True)
    print(args.folder)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
