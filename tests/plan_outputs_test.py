#!/usr/bin/python3
"""`epl plan --json` and `--svg` on the examples and a few test plans (pipelines,
interleaved, split, -np 1024): the JSON is valid against its schema
(docs/plan-json.schema.json), one entry a rank; the pictures expected are written, each
parses as XML and renders (rsvg-convert) to a PNG that is not blank. (tests/unit/
PlanJsonTest.cpp checks the JSON's figures against the module's.)

usage: plan_outputs_test.py EPL_BINARY SOURCE_DIR
"""
import json
import os
import struct
import subprocess
import sys
import tempfile
import xml.etree.ElementTree as ET
import zlib

import jsonschema

EPL, SRC = sys.argv[1], sys.argv[2]
ENV = dict(os.environ, EPL_STDLIB=os.path.join(SRC, "stdlib"))
CASES = [
    ("examples/mlp_fashion.epl", 2),
    ("examples/cnn_fashion.epl", 1),
    ("examples/gpt_char.epl", 8),
    ("examples/gpt_char_dp.epl", 2),
    ("examples/moe.epl", 4),
    ("tests/parallel/gpt_pipeline4.epl", 4),
    ("tests/parallel/gpt_interleaved_split.epl", 4),
    ("examples/gpt3_175b.epl", 1024),
]
failures = []


def check(ok, what):
    if not ok:
        failures.append(what)
        print("FAIL:", what)


def png_pixels(path):
    """The PNG's decompressed scanlines (filter bytes included)."""
    data = open(path, "rb").read()
    assert data[:8] == b"\x89PNG\r\n\x1a\n", "not a PNG"
    at, idat = 8, b""
    while at < len(data):
        length, kind = struct.unpack(">I4s", data[at:at + 8])
        if kind == b"IDAT":
            idat += data[at + 8:at + 8 + length]
        at += 12 + length
    return zlib.decompress(idat)


schema = json.load(open(os.path.join(SRC, "docs", "plan-json.schema.json")))
jsonschema.Draft202012Validator.check_schema(schema)
validator = jsonschema.Draft202012Validator(schema)

with tempfile.TemporaryDirectory() as tmp:
    for script, np in CASES:
        name = f"{script} -np {np}"
        out = subprocess.run([EPL, "plan", os.path.join(SRC, script), "-np", str(np), "--json"],
                             capture_output=True, text=True, env=ENV)
        check(out.returncode == 0, f"{name}: epl plan --json exits 0 ({out.stderr.strip()})")
        if out.returncode != 0:
            continue
        plan = json.loads(out.stdout)
        errors = sorted(validator.iter_errors(plan), key=lambda e: list(e.path))
        for e in errors[:5]:
            print(f"  {name}: {'/'.join(map(str, e.path))}: {e.message}")
        check(not errors, f"{name}: valid against docs/plan-json.schema.json")
        check(plan["np"] == np and len(plan["ranks"]) in (0, np), f"{name}: one entry a rank")
        check(plan["predicted"] is None, f"{name}: no prediction without --cluster")
        if plan["ranks"]:
            out = subprocess.run([EPL, "plan", os.path.join(SRC, script), "-np", str(np), "--json",
                                  "--cluster", "dgx-a100"], capture_output=True, text=True, env=ENV)
            check(out.returncode == 0, f"{name} --cluster: exits 0 ({out.stderr.strip()})")
            if out.returncode == 0:
                predicted = json.loads(out.stdout)
                errors = list(validator.iter_errors(predicted))
                for e in errors[:5]:
                    print(f"  {name} --cluster: {'/'.join(map(str, e.path))}: {e.message}")
                check(not errors, f"{name} --cluster: valid against the schema")
                p = predicted["predicted"] or {}
                parts = p.get("parts", {})
                check(p.get("step_seconds", 0) > 0 and 0 < p.get("mfu", 0) < 1,
                      f"{name} --cluster: a step and an MFU ({p})")
                # The step is its parts: the pipeline (or the compute and split collectives),
                # the reduction the backward does not hide, the optimizer.
                pipeline = (sum(parts.get("stage_compute_per_micro_batch", [])) and
                            max(parts["stage_compute_per_micro_batch"]) *
                            plan["policy"]["micro_batches"] + parts["bubble"])
                inline = pipeline or parts.get("compute", 0) + parts.get("split_communication", 0)
                total = (inline + parts.get("exposed_gradient_reduction", 0) +
                         parts.get("optimizer", 0) + parts.get("exposed_offload", 0))
                check(abs(total - p.get("step_seconds", 0)) <= 1e-9 + 1e-6 * total,
                      f"{name} --cluster: the parts add up to the step ({total} vs {p})")
                # The busiest rank's ops are its compute, named as the trace names them.
                ops = p.get("ops", [])
                compute = sum(o["seconds"] for o in ops)
                check(ops and abs(compute - parts.get("compute", 0)) <= 1e-9 + 1e-6 * compute,
                      f"{name} --cluster: the ops add up to the compute ({compute} vs {parts})")
                check(all(o["name"].split(" ")[0] in ("fwd", "bwd", "bwd-inputs", "bwd-params",
                                                       "recompute", "load", "zero-grads")
                          for o in ops),
                      f"{name} --cluster: ops named as the trace names them")
                check(0 <= p.get("ops_rank", -1) < np, f"{name} --cluster: ops_rank is a rank")

        pictures = os.path.join(tmp, script.replace("/", "_"))
        svg = subprocess.run([EPL, "plan", os.path.join(SRC, script), "-np", str(np), "--svg",
                              pictures], capture_output=True, text=True, env=ENV)
        check(svg.returncode == 0, f"{name}: epl plan --svg exits 0 ({svg.stderr.strip()})")
        expected = {"mesh.svg"} | ({"memory.svg"} if plan["ranks"] else set()) | (
            {"schedule.svg"} if plan["schedule"] and "bubble" in plan["schedule"] else set())
        check(set(os.listdir(pictures)) == expected,
              f"{name}: pictures {sorted(os.listdir(pictures))}, expected {sorted(expected)}")
        for f in sorted(os.listdir(pictures)):
            path = os.path.join(pictures, f)
            try:
                ET.parse(path)
            except ET.ParseError as e:
                check(False, f"{name}: {f} parses as XML ({e})")
                continue
            png = path + ".png"
            r = subprocess.run(["rsvg-convert", path, "-o", png], capture_output=True, text=True)
            check(r.returncode == 0, f"{name}: {f} renders ({r.stderr.strip()})")
            if r.returncode == 0:
                check(len(set(png_pixels(png))) > 8, f"{name}: {f} renders to more than a blank page")

print(f"{'FAILED: ' + '; '.join(failures) if failures else 'every check passed'}")
sys.exit(1 if failures else 0)
