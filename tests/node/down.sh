#!/usr/bin/env bash
# Takes down the node tests/node/up.sh brought up, also after a crash of it or of any daemon:
# kills the daemons (found by their environment mark) and every process in the node's cgroups
# (the containers), unmounts everything under the state folder, deletes the network namespaces,
# the cgroups and the state folder. Safe to run when nothing is up.
#
#   tests/node/down.sh [--keep-logs]
#
# --keep-logs keeps $ROADKEEPER_NODE_DIR/logs (the daemons' logs), for a failed up.sh.
set -euo pipefail
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
# shellcheck source=tests/node/lib.sh
source "$here/lib.sh"
keep_logs=0
[[ ${1:-} == --keep-logs ]] && keep_logs=1
((EUID == 0)) || node_fail "needs root"

# The pids of the daemons: processes whose environment carries the mark.
daemons() {
    local environ pid
    for environ in /proc/[0-9]*/environ; do
        pid=${environ#/proc/}
        pid=${pid%/environ}
        ((pid == $$)) && continue
        if grep -qxz "$DAEMON_MARK=1" "$environ" 2>/dev/null; then echo "$pid"; fi
    done
}

# The pids in the node's cgroups, in every hierarchy.
contained() {
    local hierarchy
    while read -r hierarchy; do
        [[ -d "$hierarchy/$CGROUP_ROOT" ]] && find "$hierarchy/$CGROUP_ROOT" -name cgroup.procs -exec cat {} + 2>/dev/null
    done < <(cgroup_hierarchies)
    return 0
}

# The kubelet first (it would restart containers), then everything, until nothing is left
# (bounded: a process in uninterruptible sleep is reported, not waited for forever).
for pid in $(daemons); do
    if [[ $(cat "/proc/$pid/comm" 2>/dev/null) == kubelet ]]; then kill -KILL "$pid" 2>/dev/null || true; fi
done
for _ in $(seq 50); do
    mapfile -t pids < <({ daemons; contained; } | sort -u)
    ((${#pids[@]})) || break
    kill -KILL "${pids[@]}" 2>/dev/null || true
    sleep 0.1
done
mapfile -t pids < <({ daemons; contained; } | sort -u)
((${#pids[@]} == 0)) || node_log "warning: processes still alive after SIGKILL: ${pids[*]}"

# Every mount under the state folder (overlay root filesystems, volumes, pod network
# namespaces, shm), deepest first.
if [[ -d $NODE_DIR ]]; then
    dir=$(cd "$NODE_DIR" && pwd -P)
    for _ in $(seq 5); do
        mapfile -t mounts < <(awk -v dir="$dir" '$5 == dir || index($5, dir "/") == 1 { print $5 }' /proc/self/mountinfo | sort -r)
        ((${#mounts[@]})) || break
        for mount in "${mounts[@]}"; do umount -l "$(printf '%b' "$mount")" 2>/dev/null || true; done
    done
fi

# rkn-out, rkn-node and every rkn-node-N.
for netns in $(ip netns list | awk '{print $1}'); do
    if [[ $netns == "$OUT_NETNS" || $netns == "$NODE_NETNS" || $netns == "$NODE_NETNS"-[0-9] ]]; then
        ip netns delete "$netns"
    fi
done

# The cgroups, leaves first.
while read -r hierarchy; do
    if [[ -d "$hierarchy/$CGROUP_ROOT" ]]; then
        find "$hierarchy/$CGROUP_ROOT" -depth -type d -exec rmdir {} + 2>/dev/null ||
            node_log "warning: cannot remove $hierarchy/$CGROUP_ROOT"
    fi
done < <(cgroup_hierarchies)

if [[ -d $NODE_DIR && ! -e $NODE_DIR/$NODE_DIR_MARK ]]; then
    node_log "warning: $NODE_DIR is not a node's folder (no $NODE_DIR_MARK): left as it is"
elif [[ -d $NODE_DIR ]]; then
    if ((keep_logs)); then
        find "$NODE_DIR" -mindepth 1 -maxdepth 1 ! -name logs ! -name "$NODE_DIR_MARK" -exec rm -rf {} +
    else
        rm -rf "$NODE_DIR"
    fi
fi
