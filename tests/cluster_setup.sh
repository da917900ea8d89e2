#!/bin/bash
# Installs what the namespace-cluster tests need (Debian): iproute2 (ip, tc),
# util-linux (unshare) and openssh-server/-client; with the argument `slurm`,
# also Slurm (slurmd, slurmctld, slurm-client: the slurm-wlm packages). Run as root; does nothing
# for what is already there. Exits non-zero with the reason on stderr when a
# package cannot be installed (the tests then skip with that reason).
set -u
missing=()
command -v ip >/dev/null && command -v tc >/dev/null || missing+=(iproute2)
command -v unshare >/dev/null || missing+=(util-linux)
[ -x /usr/sbin/sshd ] || missing+=(openssh-server)
command -v ssh >/dev/null || missing+=(openssh-client)
if [ "${1:-}" = slurm ]; then
  [ -x /usr/sbin/slurmd ] || missing+=(slurmd)
  [ -x /usr/sbin/slurmctld ] || missing+=(slurmctld)
  command -v srun >/dev/null || missing+=(slurm-client)
fi
if [ ${#missing[@]} -eq 0 ]; then exit 0; fi
if [ "$(id -u)" != 0 ]; then echo "not root: cannot install ${missing[*]}" >&2; exit 1; fi
export DEBIAN_FRONTEND=noninteractive
if ! apt-get install -y --no-install-recommends "${missing[@]}" >/tmp/tfring-cluster-setup.log 2>&1; then
  apt-get update >>/tmp/tfring-cluster-setup.log 2>&1
  apt-get install -y --no-install-recommends "${missing[@]}" >>/tmp/tfring-cluster-setup.log 2>&1 || {
    echo "apt-get install ${missing[*]} failed:" >&2; tail -5 /tmp/tfring-cluster-setup.log >&2; exit 1; }
fi
