#!/usr/bin/python3
"""`epl repl` as a user meets it: at a terminal (a pseudo-terminal: tab completion of
commands and policy keys, a re-plan with its diff, an error that does not end the session,
history recalled in the next session), and without one (`-c` and standard input).

usage: repl_test.py EPL_BINARY SOURCE_DIR
"""
import os
import pty
import select
import subprocess
import sys
import tempfile
import time

EPL, SRC = sys.argv[1], sys.argv[2]
SCRIPT = os.path.join(SRC, "examples", "gpt_char.epl")
ENV = dict(os.environ, EPL_STDLIB=os.path.join(SRC, "stdlib"))
failures = []


def check(ok, what, output=""):
    if not ok:
        failures.append(what)
        print(f"FAIL: {what}\n--- output ---\n{output[-3000:]}\n")


def terminal(keys, history):
    """Runs `epl repl` on a pseudo-terminal, types each of `keys` (a line each) once the
    prompt is back, and returns everything it wrote and its exit status."""
    pid, fd = pty.fork()
    if pid == 0:
        env = dict(ENV, EPL_HISTORY=history, TERM="xterm")
        os.execve(EPL, [EPL, "repl", SCRIPT, "-np", "8"], env)
    out = b""

    def prompts(n, limit=60.0):
        """Reads until the output holds n prompts, or the program ends."""
        nonlocal out
        end = time.time() + limit
        while time.time() < end and out.count(b"epl> ") < n:
            ready, _, _ = select.select([fd], [], [], 0.1)
            if ready:
                try:
                    out += os.read(fd, 65536)
                except OSError:  # the program ended
                    return

    prompts(1)
    for i, k in enumerate(keys):
        os.write(fd, k)
        prompts(i + 2)
    _, status = os.waitpid(pid, 0)
    return out.decode(errors="replace"), status


with tempfile.TemporaryDirectory() as tmp:
    history = os.path.join(tmp, "history")
    out, status = terminal([b"sta\t1\r", b"set policy.ze\t= 3\r", b"frob\r", b"mem\r",
                            b"quit\r"], history)
    check(os.WIFEXITED(status) and os.WEXITSTATUS(status) == 0, "the session ends with quit", out)
    check("epl> " in out, "a prompt", out)
    # Completion: `sta` + tab is `stage `, `policy.ze` + tab is `policy.zero `.
    check("stage 1 (replicate, line 12)" in out, "tab completes a command", out)
    check("+ model states: fp32 with adamw, ZeRO 3 (+ parameters)" in out,
          "tab completes a policy key, and set re-plans with a diff", out)
    check("- model states: fp32 with adamw, ZeRO 1 (optimizer states)" in out,
          "the diff shows what the plan was", out)
    check("error: unknown command `frob`" in out, "a bad command is an error", out)
    # The session went on after the error, with the new plan.
    check("+ params 2.47 MB + grads 2.47 MB" in out.split("frob")[-1], "it goes on after", out)
    # The next session recalls the last command with the up arrow.
    out, _ = terminal([b"\x1b[A" * 4 + b"\r", b"quit\r"], history)  # quit, mem, frob, set
    check("+ model states: fp32 with adamw, ZeRO 3" in out, "history across sessions", out)

# Without a terminal: -c runs the commands, and one failed command fails the exit code.
run = subprocess.run([EPL, "repl", SCRIPT, "-np", "8", "-c",
                      "explain linear; set np = 4; schedule; set policy.zeroo = 1; settings"],
                     capture_output=True, text=True, env=ENV)
text = run.stdout + run.stderr
check(run.returncode == 1, "-c with a bad setting exits 1", text)
check("linear: stage 1 (replicate, line 12)" in text and "split: linear column over 2" in text,
      "explain names the layer's stage and split", text)
# [4, 128, 256] by this rank's half of the 256 x 256 head: 2 x 4 x 128 x 256 x 128.
check("on rank 2, a micro-batch: forward 33.6 MFLOP in matrix products" in text,
      "explain gives the layer's FLOPs on a rank", text)
check("+ plan for model `gpt` on 4 devices" in text, "set np re-plans", text)
check("bubble" in text, "the schedule", text)
check("stage 0 |F0 F1 " in text, "the schedule's timeline", text)
check("error: unknown policy key `zeroo`" in text and "did you mean `zero`?" in text,
      "a bad setting prints epl check's diagnostic", text)
check("the plan is unchanged" in text and "np = 4" in run.stdout,
      "the bad setting is not kept", text)

run = subprocess.run([EPL, "repl", SCRIPT, "-np", "8", "-c", "rank 3; rank 3 stream; comm"],
                     capture_output=True, text=True, env=ENV)
text = run.stdout + run.stderr
check(run.returncode == 0 and "instructions a step: " in text and " 8 sends, 8 receives" in text,
      "rank R counts its stream", text)
check("     0  zero-grads" in run.stdout, "rank R stream lists it", text)
check("  stage 0 -> 1: 2.10 MB" in run.stdout, "comm: each link's bytes a step", text)

run = subprocess.run([EPL, "repl", SCRIPT], input="mesh\nstage 0\nquit\n",
                     capture_output=True, text=True, env=ENV)
check(run.returncode == 0 and "stage 0 (replicate, line 9)" in run.stdout,
      "commands from standard input", run.stdout + run.stderr)

print(f"{'FAILED: ' + ', '.join(failures) if failures else 'every check passed'}")
sys.exit(1 if failures else 0)
