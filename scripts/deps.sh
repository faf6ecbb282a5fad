#!/usr/bin/env bash
# Installs the Debian packages this project needs, and only the missing ones.
# Idempotent: prints nothing and exits 0 when everything is present.
#
#   build:    libibverbs-dev librdmacm-dev (cgo headers and libraries, rdma-core 44)
#   run:      ibverbs-providers (the rxe provider, librxe-rdmav34.so)
#   tools:    ibverbs-utils rdmacm-utils perftest (ibv_devinfo, rping, rdma_server/client, ib_*_bw/lat)
#   testbed:  qemu-system-x86 busybox-static kmod (the Soft-RoCE guest), iproute2 (the `rdma` tool),
#             make xz-utils (building siw.ko; bin/rxevm installs the kernel's headers itself,
#             because their package is named after the guest kernel, resolved at run time)
#
# The rdma-core package is deliberately not installed: it pulls udev and upgrades systemd,
# and nothing here needs it (see ../shared/TESTBED.md).
set -euo pipefail

pkgs=(gcc libc6-dev libibverbs-dev librdmacm-dev ibverbs-providers ibverbs-utils rdmacm-utils perftest
      qemu-system-x86 busybox-static kmod iproute2 make xz-utils)

missing=()
for p in "${pkgs[@]}"; do
  if ! dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q 'install ok installed'; then
    missing+=("$p")
  fi
done
[ ${#missing[@]} -eq 0 ] && exit 0

if [ "$(id -u)" -eq 0 ]; then
  sudo=()
elif command -v sudo >/dev/null 2>&1 && sudo -n true 2>/dev/null; then
  sudo=(sudo)
else
  echo "deps: missing Debian packages: ${missing[*]}" >&2
  echo "deps: install them as root with:" >&2
  echo "  apt-get install -y --no-install-recommends ${missing[*]}" >&2
  exit 1
fi

echo "deps: installing ${missing[*]}" >&2
export DEBIAN_FRONTEND=noninteractive
"${sudo[@]}" apt-get update -qq
"${sudo[@]}" apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
