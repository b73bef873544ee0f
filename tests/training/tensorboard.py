#!/usr/bin/python3
"""`epl run --tensorboard DIR`, read back independently: each event file is split into
TFRecords whose CRC-32Cs are checked by a bitwise CRC written here, and each record is
parsed with the protobuf library from a subset of TensorFlow's event.proto and
summary.proto compiled by protoc now. Checked: the first event is file_version
"brain.Event:2", a session start names the run's first step, every number of the metrics
file's step lines is a `train/…` scalar at the same step (as float32), evaluations are
`eval/…` and the final one `eval_final/…`; a resumed run writes a second file; the events
of a step can be read while the run goes on; a DIR that cannot be written is an error
before the first step.

Needs python3-protobuf and protobuf-compiler (tools/setup.sh): without them it fails.

usage: tensorboard.py EPL WORKDIR
"""
import glob
import importlib
import json
import os
import re
import shutil
import signal
import socket
import struct
import subprocess
import sys
import time

# The fields EPL writes, numbered as in TensorFlow's tensorflow/core/util/event.proto and
# tensorflow/core/framework/summary.proto. proto2, so that a field holding 0 is kept and a
# message serializes back to exactly the bytes it was parsed from.
EVENT_PROTO = """
syntax = "proto2";
package tensorflow;
message Summary {
  message Value {
    optional string tag = 1;
    optional float simple_value = 2;
  }
  repeated Value value = 1;
}
message SessionLog {
  enum SessionStatus {
    STATUS_UNSPECIFIED = 0;
    START = 1;
    STOP = 2;
    CHECKPOINT = 3;
  }
  optional SessionStatus status = 1;
}
message Event {
  optional double wall_time = 1;
  optional int64 step = 2;
  oneof what {
    string file_version = 3;
    Summary summary = 5;
    SessionLog session_log = 7;
  }
}
"""

SCRIPT = """
model m(x: f32[B, 8], labels: i32[B]) {
  return cross_entropy(linear(relu(linear(x, 16)), 4), labels)
}
train m {
  data = synthetic(samples = 64, classes = 4)
  batch = 8
  optimizer = adam(lr = 1e-2)
  clip_grad_norm = 1.0
  steps = 3
  eval = { every = 2, batches = 1 }
  checkpoint = { dir = "ck", every = 1 }
}
"""


def fail(message):
    sys.exit(f"FAIL: {message}")


def crc32c(data):
    crc = 0xFFFFFFFF
    for byte in data:
        crc ^= byte
        for _ in range(8):
            crc = (crc >> 1) ^ (0x82F63B78 if crc & 1 else 0)
    return crc ^ 0xFFFFFFFF


def masked(data):
    crc = crc32c(data)
    return ((((crc >> 15) | (crc << 17)) & 0xFFFFFFFF) + 0xA282EAD8) & 0xFFFFFFFF


def records(path, live=False):
    """The data of each TFRecord in `path`, CRCs checked. `live`: the file of a run that goes
    on, read up to its fourth record; one still being written there is left out."""
    blob = open(path, "rb").read()
    out, at = [], 0
    while at < len(blob) and not (live and len(out) == 4):
        if len(blob) - at < 12:
            break
        header = blob[at:at + 8]
        (length,) = struct.unpack("<Q", header)
        (length_crc,) = struct.unpack("<I", blob[at + 8:at + 12])
        if length_crc != masked(header):
            fail(f"{path}: record at byte {at}: length CRC {length_crc:#x}, want {masked(header):#x}")
        end = at + 12 + length + 4
        if end > len(blob):
            break
        data = blob[at + 12:at + 12 + length]
        (data_crc,) = struct.unpack("<I", blob[end - 4:end])
        if data_crc != masked(data):
            fail(f"{path}: record at byte {at}: data CRC {data_crc:#x}, want {masked(data):#x}")
        out.append(data)
        at = end
    if at != len(blob) and not live:
        fail(f"{path}: {len(blob) - at} bytes after the last whole record")
    return out


def events(pb, path, live=False):
    out = []
    for data in records(path, live):
        event = pb.Event.FromString(data)
        if event.SerializeToString() != data:
            fail(f"{path}: an event does not serialize back to its bytes (unknown fields?): {event}")
        out.append(event)
    return out


def compile_protos(work):
    folder = os.path.join(work, "proto")
    os.makedirs(folder)
    with open(os.path.join(folder, "tb_event.proto"), "w") as f:
        f.write(EVENT_PROTO)
    p = subprocess.run(["protoc", f"--proto_path={folder}", f"--python_out={folder}",
                        "tb_event.proto"], capture_output=True, text=True)
    if p.returncode != 0:
        fail(f"protoc: {p.stderr}")
    sys.path.insert(0, folder)
    return importlib.import_module("tb_event_pb2")


def run(epl, *args, want=0):
    cmd = [epl, "run", *args]
    p = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
    if p.returncode != want:
        fail(f"{' '.join(cmd)} exited {p.returncode}, want {want}\n{p.stdout}\n{p.stderr}")
    return p.stdout + p.stderr


def scalars(evs):
    """{(tag, step): value} of the summaries, and each tag's steps in file order."""
    values = {}
    for e in evs:
        if e.HasField("summary"):
            for v in e.summary.value:
                if (v.tag, e.step) in values:
                    fail(f"{v.tag} twice at step {e.step}")
                values[(v.tag, e.step)] = v.simple_value
    return values


def f32(x):
    return struct.unpack("<f", struct.pack("<f", x))[0]


def same(got, want):
    return got == f32(want)


def check_against_metrics(values, metrics, steps):
    """Every number of the metrics file's step and evaluation lines at `steps` is a scalar."""
    checked = 0
    for line in metrics:
        step = line.get("step")
        if step not in steps:
            continue
        if "loss" in line:
            names = {k: f"train/{k}" for k, v in line.items()
                     if k not in ("step", "time") and isinstance(v, (int, float))
                     and not isinstance(v, bool)}
        elif "eval_loss" in line:
            group = "eval_final" if line["eval_final"] else "eval"
            names = {k: f"{group}/{k[5:]}" for k in ("eval_loss", "eval_accuracy") if k in line}
        else:
            continue
        for key, tag in names.items():
            if (tag, step) not in values:
                fail(f"no {tag} at step {step} (metrics: {key} = {line[key]})")
            if not same(values[(tag, step)], line[key]):
                fail(f"{tag} at step {step} is {values[(tag, step)]!r}, the metrics' {key} "
                     f"{line[key]!r} as float32 is {f32(line[key])!r}")
            checked += 1
    return checked


def check_start(pb, evs, first_step, path):
    if len(evs) < 2 or evs[0].file_version != "brain.Event:2":
        fail(f"{path}: the first event is not file_version brain.Event:2: {evs[:1]}")
    start = evs[1]
    if not start.HasField("session_log") or start.session_log.status != pb.SessionLog.START \
            or start.step != first_step:
        fail(f"{path}: the second event is not a session start at step {first_step}: {start}")


def check_wall_times(evs, began, ended, path):
    times = [e.wall_time for e in evs]
    if times != sorted(times) or times[0] < began - 1 or times[-1] > ended + 1:
        fail(f"{path}: wall times {times} not rising within the run ({began} to {ended})")


def main():
    epl, work = sys.argv[1], sys.argv[2]
    shutil.rmtree(work, ignore_errors=True)
    os.makedirs(work)
    os.chdir(work)
    pb = compile_protos(work)
    with open("m.epl", "w") as f:
        f.write(SCRIPT)
    name = re.compile(r"^events\.out\.tfevents\.\d{10}\." + re.escape(socket.gethostname())
                      + r"(\.\d+)?$")

    # 1. Two steps, stopped with a checkpoint, into a folder created with its parents.
    began = time.time()
    run(epl, "m.epl", "--stop-after", "2", "--metrics", "m.jsonl", "--tensorboard", "tb/run/a")
    files = sorted(glob.glob("tb/run/a/*"))
    if len(files) != 1 or not name.match(os.path.basename(files[0])):
        fail(f"want one events.out.tfevents.<seconds>.<host> file, got {files}")
    first = events(pb, files[0])
    check_start(pb, first, 1, files[0])
    check_wall_times(first, began, time.time(), files[0])
    values = scalars(first)
    metrics = [json.loads(l) for l in open("m.jsonl")]
    checked = check_against_metrics(values, metrics, {1, 2})
    for tag in ["train/loss", "train/lr", "train/grad_norm", "train/samples_per_s",
                "train/step_seconds", "train/memory_bytes", "eval/loss", "eval/accuracy"]:
        if not any(t == tag for t, _ in values):
            fail(f"no {tag} in {files[0]}: {sorted(values)}")
    if {s for t, s in values if t == "train/loss"} != {1, 2}:
        fail(f"train/loss at steps {sorted(s for t, s in values if t == 'train/loss')}")

    # 2. Resumed: step 3 and the final evaluation go into a second file beside the first.
    run(epl, "m.epl", "--resume", "--metrics", "m.jsonl", "--tensorboard", "tb/run/a")
    first_file = files[0]
    files = sorted(glob.glob("tb/run/a/*"))
    # TensorBoard reads a folder's files in the order of their names: the first run's first.
    if len(files) != 2 or files[0] != first_file or not name.match(os.path.basename(files[1])):
        fail(f"want a second event file after the resumed run, got {files}")
    if records(first_file) != [e.SerializeToString() for e in first]:
        fail("the resumed run changed the first run's event file")
    second = events(pb, files[1])
    check_start(pb, second, 3, files[1])
    values = scalars(second)
    metrics = [json.loads(l) for l in open("m.jsonl")]
    checked += check_against_metrics(values, metrics, {3})
    if not any(t == "eval_final/loss" for t, _ in values) or any(t == "eval/loss" for t, _ in values):
        fail(f"the final evaluation is not eval_final/: {sorted(values)}")
    losses = [l["loss"] for l in metrics if "loss" in l]
    if len(losses) != 3:
        fail(f"the metrics file has {len(losses)} step lines, want 3")

    # 3. While a run goes on, the events of its steps are in the file already.
    live = subprocess.Popen([epl, "run", "m.epl", "--steps", "100000", "--metrics", "live.jsonl",
                             "--set", "train.checkpoint=none", "--set", "train.eval=none",
                             "--tensorboard", "live"],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        seen = None
        for _ in range(600):
            found = glob.glob("live/*")
            if found:
                seen = scalars(events(pb, found[0], live=True))
                if ("train/loss", 1) in seen:
                    break
            if live.poll() is not None:
                fail(f"the live run ended with {live.returncode}")
            time.sleep(0.05)
        else:
            fail(f"no train/loss of step 1 in the event file of a running run: {seen}")
    finally:
        live.send_signal(signal.SIGKILL)
        live.wait()

    # 4. A DIR that cannot be written is an error before the first step, and nothing is
    # trained or written.
    with open("afile", "w") as f:
        f.write("not a folder\n")
    for folder, why in [("afile", "it is not a folder"), ("afile/tb", "not a directory")]:
        out = run(epl, "m.epl", "--tensorboard", folder, "--metrics", "bad.jsonl",
                  "--set", 'train.checkpoint={dir="ck_bad", every=1}', want=1)
        want = f"error: cannot write TensorBoard events into `{folder}`: {why}"
        if want not in out or "--tensorboard another folder" not in out or "step 1/" in out:
            fail(f"--tensorboard {folder}: want `{want}` before the first step, got:\n{out}")
        if os.path.exists("ck_bad"):
            fail(f"--tensorboard {folder}: a failed start wrote checkpoints")

    print(f"tensorboard: {checked} scalars equal the metrics file's numbers; 2 event files "
          "for a resumed run; events read while running; unwritable folders refused")


if __name__ == "__main__":
    main()
