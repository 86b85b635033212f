#!/bin/bash
# Usage, from the repo root on the lent GPU machine, with the wheels of the six packages and of
# deepspeed 0.19.8 (+ hjson, pydantic, pydantic-core, annotated-types, typing-inspection,
# typing_extensions, torchao) carried in .whl/ (git-ignored): `bash scripts/gpu_leg.sh`.
# The CUDA leg on the lent GPU machine: every package's `-m cuda` tests, then the everyday
# script (train, evaluate, save_state, resume in a fresh launch) under each single-GPU strategy.
set -u
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 1
export PYTHONPATH=/tmp/site PYTHONUNBUFFERED=1 TORCH_EXTENSIONS_DIR=/tmp/ext OMP_NUM_THREADS=4
LOG=$OUT/gpu_leg.log
{ nvidia-smi -L; python3 -c "import torch, accel, deepspeed, accelerate; print('torch', torch.__version__, 'cuda', torch.version.cuda, 'deepspeed', deepspeed.__version__, 'accelerate', accelerate.__version__)"; } 2>&1 | tee $LOG
for p in accel-state accel-ops accel-data accel-ckpt accel-launch accel; do
  echo "=== pytest -m cuda: $p" | tee -a $LOG
  (cd packages/$p && timeout 300 python3 -m pytest tests -m cuda -p no:cacheprovider -q -rs --timeout 250 > $OUT/pytest-$p.log 2>&1; tail -4 $OUT/pytest-$p.log) | tee -a $LOG
done
A="python3 -m accel_launch.cli launch --num_processes 1"
S=examples/by_feature/checkpointing.py
run() {  # name, launch flags
  local name=$1; shift
  local dir=/tmp/runs/$name
  echo "=== everyday $name: $*" | tee -a $LOG
  timeout 150 $A "$@" $S --checkpointing_steps 5 --stop_after_step 12 --output_dir $dir > /tmp/$name.1.log 2>&1; r1=$?
  timeout 150 $A "$@" $S --checkpointing_steps 5 --resume_from_checkpoint latest --output_dir $dir > /tmp/$name.2.log 2>&1; r2=$?
  echo "rc $r1 $r2" | tee -a $LOG
  grep -E "resumed|stopping|final|Error|error" /tmp/$name.1.log /tmp/$name.2.log | tail -8 | tee -a $LOG
  if [ $r1 -ne 0 ] || [ $r2 -ne 0 ]; then tail -n 30 /tmp/$name.2.log /tmp/$name.1.log >> $LOG; fi
}
run fp32
run bf16 --mixed_precision bf16
run fp16 --mixed_precision fp16
run fsdp2 --use_fsdp --fsdp_version 2 --mixed_precision bf16
run fsdp1 --use_fsdp --fsdp_version 1
run zero2 --use_deepspeed --zero_stage 2 --mixed_precision bf16
run zero2fp16 --use_deepspeed --zero_stage 2 --mixed_precision fp16
run zero3 --use_deepspeed --zero_stage 3
echo "=== deepspeed multiple models (ZeRO-2 + ZeRO-3, two Accelerators)" | tee -a $LOG
(cd /tmp && timeout 200 $A $OLDPWD/examples/by_feature/deepspeed_multiple_models.py --output_dir /tmp/dsmm > /tmp/dsmm.log 2>&1); echo "rc $?" | tee -a $LOG; tail -n 6 /tmp/dsmm.log | tee -a $LOG
echo "=== accel test" | tee -a $LOG
timeout 120 python3 -m accel_launch.cli test 2>&1 | tail -5 | tee -a $LOG
echo done | tee -a $LOG
# Accelerate's own test scripts on one GPU: accel (plain word rename) beside Accelerate 1.15 itself.
SRC=$(python3 -c "import accelerate, os; print(os.path.dirname(accelerate.__file__))")/test_utils/scripts
mkdir -p /tmp/peer && for s in test_script test_ops test_sync test_ddp_comm_hook test_distributed_data_loop; do
  sed -E 's/\baccelerate\b/accel/g' $SRC/$s.py > /tmp/peer/$s.py
  timeout 200 python3 -m accel_launch.cli launch --num_processes 1 /tmp/peer/$s.py > /tmp/peer/$s.accel.log 2>&1; ra=$?
  timeout 200 python3 -m accelerate.commands.launch --num_processes 1 $SRC/$s.py > /tmp/peer/$s.accelerate.log 2>&1; rb=$?
  echo "peer $s on 1 GPU: accel rc $ra, accelerate rc $rb" | tee -a $LOG
  [ $ra -ne 0 ] && tail -n 25 /tmp/peer/$s.accel.log >> $LOG
done
echo peer-done | tee -a $LOG
