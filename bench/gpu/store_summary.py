"""One line per job of the store cases (bench/gpu/store_1gpu.yaml): T1's cost and where it came from.

    python bench/gpu/store_summary.py DIR   # DIR: run_cases.py's --out"""

from __future__ import annotations

import json
import sys
from pathlib import Path

for sweep in ("store_cold", "store_warm"):
    wall = t1 = timed = 0.0
    for path in sorted((Path(sys.argv[1]) / sweep).glob("*/metrics.json")):
        m = json.loads(path.read_text())
        if m.get("status") != "ok":
            print(f"{sweep} {path.parent.name}: {m.get('status')} {m.get('error')}")
            continue
        c = m["results"]["cases"][0]
        spent = c["phase_s"]["t1_and_reference"]
        wall, t1, timed = wall + m["wall_time_s"], t1 + spent, timed + (m.get("timed_s") or 0.0)
        print(f"{sweep} seq {c['seq_len']} kv {c['kv_heads']}: wall {m['wall_time_s']:.1f} s, T1+reference "
              f"{spent:.1f} s, T1 {c['t1_s'] * 1e3:.2f} ms ({c['t1_backend']}; {c['t1_backends']}), "
              f"reused {c['t1_reused']}, pruned {sorted(c['t1_pruned'])}, total from {c['total_from']} "
              f"{c['median_s'] * 1e3:.2f} ms")
    print(f"{sweep}: jobs' wall {wall:.1f} s, T1+reference {t1:.1f} s, timed {timed:.2f} s")
