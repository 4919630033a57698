"""Record a machine's raw fact outputs into a golden folder, plus the facts.json they produce.

    python -m ktdeploy.controller.facts_record tests/golden/NAME [--host H] [--path P ...]

Write SOURCE.md by hand next to it: where and how it was recorded.
"""

from __future__ import annotations

import argparse
import json
import os

from ktdeploy.controller.connectors import connect
from ktdeploy.controller.facts_gather import build_facts, gather_raw, save_raw


def main(argv=None) -> int:
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
    with open(os.path.join(args.folder, "facts.json"), "w") as f:
        json.dump(facts.model_dump(mode="json"), f, indent=2, sort_keys=True)
        f.write("\n")
    print(args.folder)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
