#!/usr/bin/env bash
# From outside, on a machine with a real NVIDIA GPU: the CLI and the TUI against a
# `--serve` engine reading the real driver, as a user would meet them. Not a test (the
# checks with verdicts are bench/device_check.py): a transcript to read, plus an SVG of
# the TUI. Needs PyTorch with CUDA for `python3` (the busy process).
#
# Usage: bench/device_tour.sh OUTDIR   (with gpulayer_tui importable by python3)
set -u
out=${1:?usage: bench/device_tour.sh OUTDIR}
mkdir -p "$out"
GPULAYER_HOME=$(mktemp -d /tmp/gpulayer-tour-XXXXXX)
export GPULAYER_HOME
here=$(cd "$(dirname "$0")" && pwd)
g() { python3 -m gpulayer_tui "$@"; }
step() { printf '\n== %s\n' "$*"; }
# Keeps the SM busy for $1 seconds holding ~0.3 GiB of tensors (plus the CUDA context).
busy='import sys, time, torch
x = torch.randn(4096, 4096, device="cuda")
print("busy", flush=True)
end = time.time() + float(sys.argv[1])
while time.time() < end:
    y = x @ x
    torch.cuda.synchronize()'

# SERVE_ARGS: e.g. "--simulate 1xH100-80GB" to try the script where no GPU is.
python3 -m gpulayer_tui --serve ${SERVE_ARGS:-} > "$out/serve.log" 2>&1 &
serve=$!
stray=
trap 'kill $serve $stray 2>/dev/null; wait' EXIT
for _ in $(seq 150); do g jobs > /dev/null 2>&1 && break; sleep 0.2; done

step "gpus (idle)"; g gpus
step "doctor"; g doctor; echo "exit $?"
step "over capacity: 200 GiB on one GPU"; g submit --gpus 1 --vram-gb 200 -- true; echo "exit $?"
step "a busy job with 4 GiB declared"
job=$(g submit --gpus 1 --vram-gb 4 --name busy -- python3 -c "$busy" 90)
echo "job $job"
step "a busy process the engine did not start"
CUDA_VISIBLE_DEVICES=0 python3 -c "$busy" 90 > "$out/stray.log" 2>&1 &
stray=$!
for _ in $(seq 100); do grep -q busy "$out/stray.log" && break; sleep 0.2; done
sleep 8  # let both run a few samples (1 s sampling; usage points every 5 s)
step "gpus (the job and the stray)"; g gpus
step "jobs"; g jobs
step "status $job"; g status "$job"
step "TUI (attached; a screenshot)"
python3 "$here/device_tui_shot.py" "$out/tui.svg"; echo "exit $?"
step "adopt the stray"; g adopt --pid "$stray" --name stray-busy --gpu; echo "exit $?"
step "gpus (after adoption)"; g gpus
step "cancel both"
for j in $(g jobs --json | python3 -c 'import json,sys; print(*[j["id"] for j in json.load(sys.stdin) if j["status"]=="running"])'); do
    g cancel "$j"
done
sleep 3
step "jobs (after cancel)"; g jobs
step "status $job (its usage)"; g status "$job"
step "gpus (freed)"; g gpus
g stop
