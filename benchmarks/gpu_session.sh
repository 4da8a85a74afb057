#!/usr/bin/env bash
# The GPU tests and benchmarks of probseq, for a CUDA machine without network access, in three parts
# of at most a few minutes each.
#
# Beforehand, on a machine with network access:   make gpu-kit   (the wheels a bare CUDA image lacks and
#   the LibriVox clips, in the git-ignored gpu_kit/; copy it beside the checkout)
# On the GPU machine:   bash benchmarks/gpu_session.sh PART OUTDIR
#   PART = tests  the CUDA device tests and the compiled SGPA step on CUDA            (~3 min)
#          bench  HiPPO scan / inducing backends / online scaling / a video-diffusion training run
#                 (accelerate, bf16, EMA) with --device cuda, and their CPU baselines                   (~7 min)
#          fleet  1,000 streams as one batched OnlineSGPR on CUDA against a loop of single-stream models on
#                 the CPU (points and LegS), a StreamFleet's shards on CUDA and on the CPU             (~6 min)
#          sgpa   SGPA vs MLE at the thesis's CIFAR scale: eager, compiled, profile    (~6 min)
# Each part writes PART_*.txt files (and Chrome traces for sgpa) into the output folder.
set -u
part=${1:?usage: gpu_session.sh tests|bench|fleet|sgpa OUTDIR}
out=${2:-${OUT:-out/gpu}}
mkdir -p "$out"
export PYTHONPATH=. PYTHONUNBUFFERED=1
if [ -d gpu_kit/wheels ]; then python3 -m pip install -q --no-deps --no-index gpu_kit/wheels/*.whl; fi
if [ -d gpu_kit/librivox ]; then
    mkdir -p /usr/share/pocketsphinx/test/data && cp -r gpu_kit/librivox /usr/share/pocketsphinx/test/data/
fi
nvidia-smi > "$out/${part}_nvidia_smi.txt" 2>&1
python3 -c "import torch, gpytorch; print(torch.__version__, torch.version.cuda, gpytorch.__version__, torch.cuda.get_device_name())" \
    > "$out/${part}_versions.txt" 2>&1
run() {  # run NAME COMMAND...: output to $out/${part}_NAME.txt, a line per step on stdout
    local name=$1; shift
    local start=$SECONDS
    "$@" > "$out/${part}_${name}.txt" 2>&1
    echo "${part}_${name}: exit $? after $((SECONDS - start)) s"
}
case $part in
tests)
    run device_tests python3 -m pytest -p no:cacheprovider -rs -q tests/test_device_static.py tests/hippo/test_hippo_devices.py \
        tests/sgpa/test_sgpa_devices.py tests/sgpa/test_sgpa_compile.py tests/pseudovideo/test_pseudovideo_devices.py ;;
bench)
    run hippo_scan python3 benchmarks/hippo_scan.py --device cuda
    run hippo_inducing python3 benchmarks/hippo_inducing.py --device cuda
    run online_scaling python3 benchmarks/online_scaling.py --device cuda --budget-s 60
    run diffusion_train python3 benchmarks/diffusion_training.py --device cuda --steps 300 --batch 64 --mixed-precision bf16 --ema 0.999
    run diffusion_train_fp32 python3 benchmarks/diffusion_training.py --device cuda --steps 300 --batch 64
    run diffusion_train_cpu python3 benchmarks/diffusion_training.py --device cpu --steps 20 --batch 64 ;;
fleet)
    run fleet_points python3 benchmarks/fleet.py --device cuda --streams 1000 --tasks 10
    run fleet_hippo python3 benchmarks/fleet.py --variables hippo --device cuda --streams 1000 --tasks 10
    run fleet_scaling python3 benchmarks/fleet.py --variables hippo --device cuda --scaling --tasks 10
    run fleet_engines python3 benchmarks/fleet_engines.py --no-ray --device cuda --streams 2000 --tasks 10
    run fleet_engines_cpu python3 benchmarks/fleet_engines.py --no-ray --streams 2000 --tasks 10 ;;
sgpa)
    run count_ops python3 benchmarks/sgpa_cost.py --preset cifar --device cuda --count-ops --sampler decomposed diagonal full
    run cost_eager python3 benchmarks/sgpa_cost.py --preset cifar --device cuda
    run cost_compiled python3 benchmarks/sgpa_cost.py --preset cifar --device cuda --compile reduce-overhead
    run profile python3 benchmarks/sgpa_cost.py --preset cifar --device cuda --sampler decomposed --repeats 3 \
        --profile --trace-dir "$out" ;;
*)
    echo "unknown part $part (tests, bench, fleet or sgpa)" >&2; exit 2 ;;
esac
