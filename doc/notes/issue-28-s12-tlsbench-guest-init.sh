#!/bin/busybox sh
/bin/busybox --install -s /bin
mount -t proc proc /proc
mount -t sysfs sys /sys
mount -t devtmpfs dev /dev
mkdir -p /tmp && mount -t tmpfs tmp /tmp
ip link set lo up
export HOME=/tmp TMPDIR=/tmp PATH=/bin:/usr/bin
echo "ZCVM: start kernel $(uname -r), $(nproc) cpus"
depmod
echo /sbin/modprobe > /proc/sys/kernel/modprobe
modprobe tls && echo "ZCVM: tls loaded"
modprobe gcm; modprobe aesni-intel; modprobe ghash-clmulni-intel
echo "ZCVM: zcbench begin"
/zcbench -scenarios https,files-tls,relay-tls -relay-bytes 1048576 -reps 3 -svc-d 2s -file-size 16777216 -file-dir /tmp -json /tmp/r.json; echo "ZCVM: zcbench rc=$?"; echo "ZCVM: json begin"; cat /tmp/r.json; echo; echo "ZCVM: json end"
cat /proc/net/tls_stat
echo "ZCVM: dmesg begin"; dmesg | grep -E 'BUG|WARNING|Oops|Call Trace' | head; echo "ZCVM: dmesg end"
sync
poweroff -f
