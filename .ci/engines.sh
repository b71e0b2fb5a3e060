#!/usr/bin/env bash
# Real launch engines for tests/engines/: a one-node Slurm cluster (slurmctld + slurmd + slurmdbd for sacct,
# munge authentication, MariaDB on a Unix socket only) and Open MPI, on THIS machine. Idempotent; run as root.
# Seconds when everything already runs; about a minute on a fresh Debian 12 machine (mostly apt-get).
#
#   .ci/engines.sh            set up / start what is missing, wait until `sinfo` shows the node idle
#   .ci/engines.sh --status   print what runs; exit 1 when the cluster is not ready (starts nothing)
#
# Slurm talks over 127.0.0.1 only (NodeAddr/SlurmctldHost/DbdHost); no cgroups (proctrack/linuxproc,
# task/none), so it also works in containers and sandboxes. Logs: /var/log/meshplan-engines/.
set -euo pipefail
export PATH="$PATH:/usr/sbin:/sbin"  # the daemons live there; a root shell from su/sudo may lack them

LOG_DIR=/var/log/meshplan-engines
CONF_DIR=/etc/slurm
NODE=$(hostname -s)
CLUSTER=meshplan
WAIT_S=${MESHPLAN_ENGINES_WAIT:-60}

say() { echo "engines: $*"; }
die() {
    echo "engines: ERROR: $*" >&2
    for f in "$LOG_DIR"/*.log "$LOG_DIR"/mariadb/*.log; do
        [ -f "$f" ] && { echo "--- last lines of $f" >&2; tail -n 15 "$f" >&2; }
    done
    exit 1
}
running() { pgrep -x "$1" >/dev/null 2>&1; }
node_state() { sinfo -h -N -n "$NODE" -o '%T' 2>/dev/null | head -n 1 || true; }
ready() {
    local s
    s=$(node_state)
    case "$s" in idle | mixed | allocated | completing) ;; *) return 1 ;; esac
    sacct -n -X -S now-1minutes -o JobID >/dev/null 2>&1 && command -v mpirun >/dev/null 2>&1
}

if [ "${1:-}" = "--status" ]; then
    for d in munged mariadbd slurmdbd slurmctld slurmd; do
        if running "$d"; then say "$d running"; else say "$d NOT running"; fi
    done
    say "node $NODE: $(node_state || true)"
    ready && { say "ready"; exit 0; }
    say "not ready (run: sudo .ci/engines.sh)"
    exit 1
fi

[ "$(id -u)" = 0 ] || die "must run as root (it installs packages and starts daemons): sudo $0"

# Never take over a Slurm this script did not set up (a real cluster node or a developer's own test cluster).
for f in "$CONF_DIR/slurm.conf" "$CONF_DIR/slurmdbd.conf"; do
    if [ -f "$f" ] && ! grep -q "^# Written by meshplan's .ci/engines.sh" "$f" && [ "${MESHPLAN_ENGINES_FORCE:-0}" != 1 ]; then
        echo "engines: ERROR: $f exists and was not written by this script; not touching this machine's" \
            "Slurm (MESHPLAN_ENGINES_FORCE=1 overrides)" >&2
        exit 1
    fi
done

# --- packages --------------------------------------------------------------------------------------------
pkgs=()
command -v slurmctld >/dev/null 2>&1 || pkgs+=(slurmctld)
command -v slurmd >/dev/null 2>&1 || pkgs+=(slurmd)
command -v slurmdbd >/dev/null 2>&1 || pkgs+=(slurmdbd)
command -v sbatch >/dev/null 2>&1 || pkgs+=(slurm-client)
command -v munged >/dev/null 2>&1 || pkgs+=(munge)
command -v mariadbd >/dev/null 2>&1 || pkgs+=(mariadb-server)
command -v mpirun >/dev/null 2>&1 || pkgs+=(openmpi-bin)
if [ ${#pkgs[@]} -gt 0 ]; then
    command -v apt-get >/dev/null 2>&1 || die "missing ${pkgs[*]} and no apt-get to install them"
    say "installing ${pkgs[*]} (apt-get)"
    export DEBIAN_FRONTEND=noninteractive
    # policy-rc.d: let no package start its daemon through invoke-rc.d; this script starts them itself
    # (an existing policy, e.g. a container image's, is left as it is)
    own_policy=0
    if [ ! -e /usr/sbin/policy-rc.d ]; then
        printf '#!/bin/sh\nexit 101\n' >/usr/sbin/policy-rc.d && chmod 755 /usr/sbin/policy-rc.d && own_policy=1
    fi
    install_ok=0
    apt-get install -y -q --no-install-recommends "${pkgs[@]}" >"/tmp/meshplan-engines-apt.log" 2>&1 && install_ok=1
    if [ "$install_ok" = 0 ]; then
        apt-get update -q >>"/tmp/meshplan-engines-apt.log" 2>&1 || true
        apt-get install -y -q --no-install-recommends "${pkgs[@]}" >>"/tmp/meshplan-engines-apt.log" 2>&1 && install_ok=1
    fi
    if [ "$own_policy" = 1 ]; then rm -f /usr/sbin/policy-rc.d; fi
    [ "$install_ok" = 1 ] || die "apt-get install ${pkgs[*]} failed; see /tmp/meshplan-engines-apt.log"
fi

mkdir -p "$LOG_DIR" "$CONF_DIR" /var/spool/slurmctld /var/spool/slurmd /run/slurm

# --- munge -----------------------------------------------------------------------------------------------
if [ ! -s /etc/munge/munge.key ]; then
    say "creating /etc/munge/munge.key"
    mkdir -p /etc/munge
    dd if=/dev/urandom of=/etc/munge/munge.key bs=1 count=1024 status=none
fi
mkdir -p /run/munge /var/lib/munge /var/log/munge
chown munge:munge /etc/munge /etc/munge/munge.key /run/munge /var/lib/munge /var/log/munge
chmod 0700 /etc/munge /var/lib/munge /var/log/munge
chmod 0600 /etc/munge/munge.key
chmod 0755 /run/munge
if ! running munged; then
    say "starting munged"
    runuser -u munge -- munged --force >>"$LOG_DIR/munged.log" 2>&1 || die "munged did not start"
fi

# --- configuration ---------------------------------------------------------------------------------------
cpus=$(nproc)
mem_mb=$(awk '/^MemTotal:/ { printf "%d", $2 / 1024 * 0.9 }' /proc/meminfo)
slurm_conf=$(cat <<EOF
# Written by meshplan's .ci/engines.sh: a one-node test cluster on this host (loopback only, no cgroups).
ClusterName=$CLUSTER
SlurmctldHost=$NODE(127.0.0.1)
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
CredType=cred/munge
StateSaveLocation=/var/spool/slurmctld
SlurmdSpoolDir=/var/spool/slurmd
SlurmctldPidFile=/run/slurm/slurmctld.pid
SlurmdPidFile=/run/slurm/slurmd.pid
SlurmctldLogFile=$LOG_DIR/slurmctld.log
SlurmdLogFile=$LOG_DIR/slurmd.log
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
JobAcctGatherType=jobacct_gather/none
MpiDefault=none
SwitchType=switch/none
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
SchedulerType=sched/backfill
ReturnToService=2
KillWait=30
# sbatch --wait polls every 2 s while 2 >= MinJobAge / 2, else backs off to 8 and 32 s (a 12 s job took 42 s
# to return at the default 300); ended jobs leave slurmctld after 4 s, sacct keeps them
MinJobAge=4
AccountingStorageType=accounting_storage/slurmdbd
AccountingStorageHost=127.0.0.1
JobCompType=jobcomp/none
NodeName=$NODE NodeAddr=127.0.0.1 CPUs=$cpus RealMemory=$mem_mb State=UNKNOWN
PartitionName=debug Nodes=$NODE Default=YES MaxTime=INFINITE State=UP
EOF
)
dbd_conf=$(cat <<EOF
# Written by meshplan's .ci/engines.sh: accounting for sacct, in MariaDB over its Unix socket.
AuthType=auth/munge
DbdHost=localhost
DbdAddr=127.0.0.1
SlurmUser=root
PidFile=/run/slurm/slurmdbd.pid
LogFile=$LOG_DIR/slurmdbd.log
StorageType=accounting_storage/mysql
StorageHost=localhost
StorageUser=root
StorageLoc=slurm_acct_db
EOF
)
changed=0
write_conf() {  # path mode text: rewrite only when different, remember that something changed
    if [ ! -f "$1" ] || [ "$(cat "$1")" != "$3" ]; then
        printf '%s\n' "$3" >"$1"
        chmod "$2" "$1"
        changed=1
    fi
}
write_conf "$CONF_DIR/slurm.conf" 644 "$slurm_conf"
write_conf "$CONF_DIR/slurmdbd.conf" 600 "$dbd_conf"

if [ "$changed" = 0 ] && ready; then
    say "Slurm node $NODE is $(node_state), sacct works, mpirun is $(command -v mpirun): ready"
    exit 0
fi
if [ "$changed" = 1 ]; then
    say "configuration written ($CONF_DIR/slurm.conf: $NODE, $cpus CPUs, $mem_mb MB); (re)starting Slurm"
    for d in slurmd slurmctld slurmdbd; do  # by the pid files this script's configuration names
        pid=$(cat "/run/slurm/$d.pid" 2>/dev/null || true)
        if [ -n "$pid" ] && [ "$(ps -o comm= -p "$pid" 2>/dev/null || true)" = "$d" ]; then
            kill "$pid" || true
        fi
    done
    for _ in $(seq 50); do
        running slurmd || running slurmctld || running slurmdbd || break
        sleep 0.2
    done
fi

# --- MariaDB (Unix socket only: --skip-networking) -------------------------------------------------------
if ! running mariadbd; then
    say "starting MariaDB (socket only)"
    mkdir -p /run/mysqld "$LOG_DIR/mariadb" && chown mysql:mysql /run/mysqld "$LOG_DIR/mariadb"
    [ -d /var/lib/mysql/mysql ] || mariadb-install-db --user=mysql --datadir=/var/lib/mysql >>"$LOG_DIR/mariadb.log" 2>&1 \
        || die "mariadb-install-db failed"
    setsid mariadbd-safe --skip-networking --skip-syslog --log-error="$LOG_DIR/mariadb/mariadb.log" \
        >>"$LOG_DIR/mariadb-safe.log" 2>&1 </dev/null &
fi
for _ in $(seq "$((WAIT_S * 5))"); do
    mariadb -u root -e 'SELECT 1' >/dev/null 2>&1 && break
    sleep 0.2
done
mariadb -u root -e 'SELECT 1' >/dev/null 2>&1 || die "MariaDB did not come up within ${WAIT_S}s"

# --- Slurm daemons ---------------------------------------------------------------------------------------
if ! running slurmdbd; then
    say "starting slurmdbd"
    slurmdbd || die "slurmdbd did not start"
    for _ in $(seq "$((WAIT_S * 5))"); do
        sacctmgr -n -i show cluster >/dev/null 2>&1 && break
        sleep 0.2
    done
fi
sacctmgr -n -P show cluster format=cluster 2>/dev/null | grep -qx "$CLUSTER" \
    || sacctmgr -i add cluster "$CLUSTER" >/dev/null 2>&1 || die "could not register cluster $CLUSTER with slurmdbd"
if ! running slurmctld; then
    say "starting slurmctld"
    slurmctld || die "slurmctld did not start"
fi
if ! running slurmd; then
    say "starting slurmd"
    slurmd || die "slurmd did not start"
fi

say "waiting (up to ${WAIT_S}s) for node $NODE to be idle"
state=""
for _ in $(seq "$((WAIT_S * 2))"); do
    state=$(node_state)
    case "$state" in
        idle | mixed | allocated) break ;;
        down* | drain* | fail*)
            scontrol update nodename="$NODE" state=resume >/dev/null 2>&1 || true ;;
    esac
    sleep 0.5
done
case "$state" in
    idle | mixed | allocated) ;;
    *) die "node $NODE is '${state:-unknown}' after ${WAIT_S}s (sinfo -R: $(sinfo -h -R 2>/dev/null | head -n 1))" ;;
esac
for _ in $(seq "$((WAIT_S * 2))"); do
    sacct -n -X -S now-1minutes -o JobID >/dev/null 2>&1 && break
    sleep 0.5
done
sacct -n -X -S now-1minutes -o JobID >/dev/null 2>&1 || die "sacct does not answer: $(sacct -n -X 2>&1 | head -n 1)"
say "Slurm node $NODE is $state, sacct works, mpirun is $(command -v mpirun): ready"
