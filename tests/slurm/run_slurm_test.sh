#!/usr/bin/env bash
# The workflow on a real SLURM, not a mock: bring up a single-node cluster on this machine (Debian's
# slurmctld, slurmd, slurm-client and munge; two fake GPUs as gres on character devices), run the
# CPU configuration (config/test.yaml) once locally and once through the executor plugin with
# workflow/profiles/slurm, check both made the same files with the same verdicts, tear it down.
#
#   bash tests/slurm/run_slurm_test.sh          # as root (it installs packages, writes /etc/slurm)
#
# Exit 0 with one line "skipped: ..." when the cluster cannot be had here (not root, no apt, the
# packages or the executor plugin cannot be installed, the daemons do not start): that says
# nothing about the project. Exit 1 when the cluster ran and the results differ, or the run failed.
# Idempotent: packages stay installed; the config, the fake devices and the daemons it started go.
# EVO_SDPA_SLURM_STRICT=1 turns every "skipped" into a failure; EVO_SDPA_SLURM_KEEP=1 keeps the
# two runs' trees (their snakemake.log, results/) for a look. PYTHON: the interpreter whose
# Snakemake runs (default .venv/bin/python).
set -uo pipefail
cd "$(dirname "$0")/../.."
REPO=$PWD
PYTHON=${PYTHON:-$REPO/.venv/bin/python}
MARK="# evo-sdpa single-node test cluster (tests/slurm/run_slurm_test.sh)"
CONF=/etc/slurm/slurm.conf        # the default path: the executor's job steps drop SLURM_CONF
GRES=/etc/slurm/gres.conf
STATE=/var/tmp/evo-sdpa-slurm     # daemons' state, logs and pid files
WORK=$(mktemp -d /var/tmp/evo-sdpa-slurm-run.XXXXXX)
ACCOUNT=evo_sdpa
START=$(date +%s)

skip() {
  if [ "${EVO_SDPA_SLURM_STRICT:-0}" = 1 ]; then echo "evo-sdpa: slurm test: $*" >&2; exit 1; fi
  echo "skipped: slurm test: $*"; exit 0
}
die() { echo "evo-sdpa: slurm test: $*" >&2; exit 1; }

started=()
teardown() {
  command -v scancel > /dev/null && [ -f "$CONF" ] && grep -qF "$MARK" "$CONF" && scancel --user=root 2> /dev/null
  for pidfile in "${started[@]}"; do
    [ -f "$pidfile" ] && kill "$(cat "$pidfile")" 2> /dev/null
  done
  sleep 1
  if [ -f "$CONF" ] && grep -qF "$MARK" "$CONF"; then rm -f "$CONF" "$GRES"; fi
  rm -f /dev/evo-sdpa-fake-gpu0 /dev/evo-sdpa-fake-gpu1
  if [ "${EVO_SDPA_SLURM_KEEP:-0}" = 1 ]; then
    echo "slurm test: runs kept in $WORK, daemon logs in $STATE"
  else
    rm -rf "$WORK" "$STATE"
  fi
}
trap teardown EXIT
trap "exit 143" TERM INT  # a timeout still tears the cluster down

# ---------------------------------------------------------------- packages
[ "$(id -u)" = 0 ] || skip "needs root (it installs packages and writes $CONF)"
[ -x "$PYTHON" ] || skip "no $PYTHON (create the venv: see README.md)"
if ! command -v slurmctld > /dev/null || ! command -v slurmd > /dev/null || ! command -v sbatch > /dev/null \
    || ! command -v munged > /dev/null; then
  command -v apt-get > /dev/null || skip "no apt-get to install slurmctld slurmd slurm-client munge"
  export DEBIAN_FRONTEND=noninteractive
  { apt-get update -q && apt-get install -y -q --no-install-recommends slurmctld slurmd slurm-client munge; } \
    > "$WORK/apt.log" 2>&1 || skip "apt-get could not install slurmctld slurmd slurm-client munge: $(tail -n 1 "$WORK/apt.log")"
fi
"$PYTHON" -m pip install -q -r envs/slurm-requirements.txt > "$WORK/pip.log" 2>&1 \
  || skip "pip could not install envs/slurm-requirements.txt: $(grep -v WARNING "$WORK/pip.log" | tail -n 1)"

# ---------------------------------------------------------------- munge
if ! munge -n 2> /dev/null | unmunge > /dev/null 2>&1; then
  if [ ! -s /etc/munge/munge.key ]; then
    dd if=/dev/urandom of=/etc/munge/munge.key bs=1024 count=1 status=none
  fi
  chown munge:munge /etc/munge/munge.key && chmod 400 /etc/munge/munge.key
  mkdir -p /run/munge /var/lib/munge /var/log/munge && chown munge:munge /run/munge /var/lib/munge /var/log/munge
  runuser -u munge -- munged --pid-file=/run/munge/evo-sdpa-munged.pid > "$WORK/munged.log" 2>&1 \
    || skip "munged does not start: $(tail -n 1 "$WORK/munged.log")"
  started+=(/run/munge/evo-sdpa-munged.pid)
  munge -n | unmunge > /dev/null 2>&1 || skip "munge credentials do not verify"
fi

# ---------------------------------------------------------------- the cluster
if [ -f "$CONF" ] && ! grep -qF "$MARK" "$CONF"; then
  skip "$CONF exists and is not this test's (a real cluster's config is left alone)"
fi
node=$(hostname -s)
cpus=$(nproc)
mem_mb=$(( $(awk '/MemTotal/ {print $2}' /proc/meminfo) / 1024 * 8 / 10 ))
mkdir -p /etc/slurm "$STATE/ctld" "$STATE/d"
for i in 0 1; do  # character devices: gres on plain files gives jobs an empty CUDA_VISIBLE_DEVICES
  [ -c /dev/evo-sdpa-fake-gpu$i ] || mknod /dev/evo-sdpa-fake-gpu$i c 1 3
done
cat > "$CONF" <<EOF
$MARK
ClusterName=evosdpa
SlurmctldHost=$node
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
StateSaveLocation=$STATE/ctld
SlurmdSpoolDir=$STATE/d
SlurmctldPidFile=$STATE/slurmctld.pid
SlurmdPidFile=$STATE/slurmd.pid
SlurmctldLogFile=$STATE/slurmctld.log
SlurmdLogFile=$STATE/slurmd.log
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
MpiDefault=none
SchedulerType=sched/backfill
SelectType=select/cons_tres
SelectTypeParameters=CR_Core_Memory
AccountingStorageType=accounting_storage/none
JobAcctGatherType=jobacct_gather/none
JobCompType=jobcomp/none
# No accounting: the executor follows its jobs with squeue, which must still list a finished job
# well after the status delay.
MinJobAge=600
ReturnToService=2
SlurmdParameters=config_overrides
GresTypes=gpu
NodeName=$node CPUs=$cpus RealMemory=$mem_mb Gres=gpu:2 State=UNKNOWN
PartitionName=gpu Nodes=$node Default=YES MaxTime=INFINITE State=UP
EOF
cat > "$GRES" <<EOF
$MARK
NodeName=$node Name=gpu File=/dev/evo-sdpa-fake-gpu[0-1]
EOF
for daemon in slurmctld slurmd; do
  if [ -f "$STATE/$daemon.pid" ] && kill -0 "$(cat "$STATE/$daemon.pid")" 2> /dev/null; then
    kill "$(cat "$STATE/$daemon.pid")"; sleep 1  # ours, from a run that did not tear down
  fi
done
slurmctld -i > "$WORK/slurmctld.out" 2>&1 || skip "slurmctld does not start: $(tail -n 1 "$STATE/slurmctld.log" 2> /dev/null)"
started+=("$STATE/slurmctld.pid")
slurmd > "$WORK/slurmd.out" 2>&1 || skip "slurmd does not start: $(tail -n 1 "$STATE/slurmd.log" 2> /dev/null)"
started+=("$STATE/slurmd.pid")
for _ in $(seq 60); do
  state=$(sinfo -h -N -o %T 2> /dev/null | head -n 1)
  case "$state" in idle*|mixed*|allocated*) break ;; esac
  [ "$state" = down ] || [ "$state" = drained ] && scontrol update nodename="$node" state=resume 2> /dev/null
  sleep 1
done
case "$state" in idle*|mixed*|allocated*) ;; *) skip "the node did not come up (state '${state:-none}'): $(tail -n 1 "$STATE/slurmd.log" 2> /dev/null)" ;; esac
echo "slurm test: cluster up on $node ($cpus CPUs, 2 fake GPUs) after $(( $(date +%s) - START )) s"

# ---------------------------------------------------------------- the two runs
for run in local slurm; do
  mkdir -p "$WORK/$run"
  cp -r Snakefile workflow config kernels scripts envs "$WORK/$run/"
done
export PATH="$(dirname "$PYTHON"):$PATH" EVO_SDPA_FORCE_CPU=1
target=(results/final/final_summary.md --configfile config/test.yaml)
(cd "$WORK/local" && "$PYTHON" -m snakemake --cores 2 "${target[@]}" > snakemake.log 2>&1) \
  || { tail -n 20 "$WORK/local/snakemake.log" >&2; die "the local run failed"; }
echo "slurm test: local run done after $(( $(date +%s) - START )) s"
(cd "$WORK/slurm" && "$PYTHON" -m snakemake --workflow-profile workflow/profiles/slurm \
    --default-resources slurm_account=$ACCOUNT slurm_partition=gpu mem_mb=1000 runtime=30 \
    --slurm-status-command squeue --slurm-init-seconds-before-status-checks 2 --max-threads "$cpus" \
    "${target[@]}" > snakemake.log 2>&1) \
  || { tail -n 30 "$WORK/slurm/snakemake.log" >&2; die "the run through SLURM failed (log above)"; }
echo "slurm test: slurm run done after $(( $(date +%s) - START )) s"
"$PYTHON" tests/slurm/compare_runs.py --local "$WORK/local" --slurm "$WORK/slurm" \
  || die "the SLURM run's results differ from the local run's"
echo "slurm test: passed in $(( $(date +%s) - START )) s"
