#!/bin/sh
# PID 1 of the testbed guest (busybox). It loads the RDMA and 9p modules,
# mounts the host's root read-only, creates rxe0 or siw0 on a netdev, then runs the
# rxevm guest agent chrooted into the host root, and powers off. Its settings
# come from /rxevm.conf, written per guest by the host (see initramfs.go).
export PATH=/bin
. /rxevm.conf

fail() {
	echo "rxevm-init: $*"
	poweroff -f
	sleep 60
}

mount -t proc proc /proc
mount -t sysfs sysfs /sys
mount -t devtmpfs devtmpfs /dev

while read -r mod; do
	insmod "/lib/modules/$mod" || fail "insmod $mod failed"
done </modules.list

mkdir -p /host
mount -t 9p -o trans=virtio,version=9p2000.L,ro,msize=512000,cache=loose hostroot /host ||
	fail "cannot mount the host root over 9p"
mount -t 9p -o trans=virtio,version=9p2000.L,msize=512000 share "/host$SHARE" ||
	fail "cannot mount the writable share"
if [ -n "$OUT" ]; then
	mount -t 9p -o trans=virtio,version=9p2000.L,msize=512000 out "/host$OUT" ||
		fail "cannot mount the writable directory $OUT"
fi
mount -t proc proc /host/proc
mount -t sysfs sysfs /host/sys
mount -t devtmpfs devtmpfs /host/dev
mkdir -p /host/dev/pts /host/dev/shm
mount -t devpts devpts /host/dev/pts
mount -t tmpfs tmpfs /host/dev/shm
mount -t tmpfs tmpfs /host/run
mount -t tmpfs tmpfs /host/var/tmp

# The command's stdout and stderr travel on ttyS1 and ttyS2: raw, so bytes
# arrive as written (no \n -> \r\n).
stty -F /dev/ttyS1 raw -echo
stty -F /dev/ttyS2 raw -echo

# rxe and siw need a non-loopback netdev. MTU 4200 gives rxe an active MTU of 4096.
ip link set lo up
ip link set "$NIC" mtu 4200 up || fail "no netdev $NIC"
ip addr add "$ADDR" dev "$NIC"
# An IPv6 address too, without duplicate address detection so it is usable
# at once. The host's iproute2, by absolute path: busybox runs its own applet
# for a bare "ip" even inside chroot, and busybox ip has no nodad.
chroot /host /usr/bin/ip -6 addr add "$ADDR6" dev "$NIC" nodad || fail "cannot add $ADDR6"
# A name for both addresses, for dials that try each of a name's
# addresses: the host's hosts file and these lines, over its own.
{
	cat /host/etc/hosts
	echo "${ADDR6%/*} $HOST"
	echo "${ADDR%/*} $HOST"
} >/hosts
mount -o bind /hosts /host/etc/hosts || fail "cannot mount /etc/hosts"
chroot /host /usr/bin/rdma link add "${KIND}0" type "$KIND" netdev "$NIC" || fail "rdma link add ${KIND}0 failed"
i=0
until grep -q ACTIVE "/sys/class/infiniband/${KIND}0/ports/1/state" 2>/dev/null; do
	i=$((i + 1))
	[ $i -gt 100 ] && fail "${KIND}0 port 1 never became ACTIVE"
	sleep 0.1
done

chroot /host "$AGENT" -guest-agent "$JOB"
sync
poweroff -f
sleep 60
